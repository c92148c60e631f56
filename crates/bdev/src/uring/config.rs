//! The decoder of `bdev_uring_create` (see [`crate::config`]) and the
//! bdev it creates.
use serde_json::{Map, Value};

use super::options::UringOptions;
use crate::bdev::Bdev;
use crate::params::{ParamError, Params};

/// `bdev_uring_create`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringParams {
    pub name: String,
    pub filename: String,
    /// None (or 0 in the file): the file's own logical block size.
    pub block_size: Option<u32>,
    pub uuid: Option<[u8; 16]>,
}

impl UringParams {
    /// Opens the bdev with O_DIRECT, as SPDK does; where the file system
    /// refuses O_DIRECT (tmpfs), through the page cache instead, with a
    /// warning. If both fail, the O_DIRECT error is returned.
    pub fn create(&self) -> crate::error::Result<Bdev> {
        self.create_with(UringOptions::default())
    }

    /// `create` with `base`'s ring options (its block size is replaced by
    /// this entry's; `direct` is tried first whatever `base` says).
    pub fn create_with(&self, base: UringOptions) -> crate::error::Result<Bdev> {
        let opts = UringOptions {
            block_size: self.block_size,
            direct: true,
            ..base
        };
        match Bdev::uring(&self.name, &self.filename, opts.clone()) {
            Ok(b) => Ok(b),
            Err(direct) => {
                let buffered = UringOptions {
                    direct: false,
                    ..opts
                };
                match Bdev::uring(&self.name, &self.filename, buffered) {
                    Ok(b) => {
                        tracing::warn!(
                            "bdev {}: {} opened through the page cache (O_DIRECT failed: {direct})",
                            self.name,
                            self.filename
                        );
                        Ok(b)
                    }
                    Err(_) => Err(direct),
                }
            }
        }
    }
}

const URING_PARAMS: &[&str] = &["name", "filename", "block_size", "uuid"];

/// `bdev_uring_create`.
pub(crate) fn uring_create(obj: &Map<String, Value>) -> Result<UringParams, ParamError> {
    let p = Params::with_known("bdev_uring_create", obj, URING_PARAMS)?;
    Ok(UringParams {
        name: p.required("name", p.name(true)?)?.to_string(),
        filename: p.str_req("filename")?.to_string(),
        block_size: p.u32_opt("block_size")?.filter(|&b| b != 0),
        uuid: p.uuid_opt("uuid")?,
    })
}
