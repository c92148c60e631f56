//! A namespace's bdev made from its configuration: null, RAM, a file or
//! block device through io_uring, or the bdev the caller handed over.
//! (The controller model, `pollux_controller`, serves it through its own
//! channel; see its `store` module.)
use pollux_bdev::{Bdev, UringOptions};
use pollux_controller::Namespace;

use crate::config::{BackendConfig, NamespaceConfig};
use crate::SoftError;

/// Creates namespace `nsid` (1-based) of a controller with serial
/// `serial`.
pub(crate) fn open(serial: &str, nsid: u32, cfg: &NamespaceConfig) -> Result<Namespace, SoftError> {
    let bs = 1u32 << cfg.lba_shift;
    let blocks = cfg.size_bytes >> cfg.lba_shift;
    let name = || format!("{serial}n{nsid}");
    let bdev_err = |source| SoftError::Bdev { nsid, source };
    let bdev = match &cfg.backend {
        BackendConfig::Null => Bdev::null(&name(), bs, blocks).map_err(bdev_err)?,
        BackendConfig::Ram => Bdev::ram(&name(), bs, blocks).map_err(bdev_err)?,
        BackendConfig::Bdev(b) => b.clone(),
        BackendConfig::File { path } => {
            // The emulator's file namespaces keep their old behaviour:
            // created when a size is given, through the page cache (the
            // host's PRP segments need no O_DIRECT alignment).
            if cfg.size_bytes != 0 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(|e| {
                        bdev_err(pollux_bdev::Error::Os {
                            name: name(),
                            source: std::io::Error::new(
                                e.kind(),
                                format!("{}: {e}", path.display()),
                            ),
                        })
                    })?;
            }
            let opts = UringOptions {
                block_size: Some(bs),
                size: (cfg.size_bytes != 0).then_some(cfg.size_bytes),
                direct: false,
                register_buffers: false,
                wake_fd: false,
                ..UringOptions::default()
            };
            Bdev::uring(&name(), path, opts).map_err(bdev_err)?
        }
    };
    // `SoftConfig::validate` checked a given bdev's block size and size.
    let nsze = if blocks == 0 {
        bdev.info().num_blocks
    } else {
        blocks
    };
    if nsze == 0 {
        return Err(SoftError::InvalidConfig(format!(
            "namespace {nsid} is smaller than one LBA"
        )));
    }
    Namespace::new(bdev, nsze)
        .map_err(|e| SoftError::InvalidConfig(format!("namespace {nsid}: {e}")))
}
