//! The decoders of `bdev_null_create` and `bdev_malloc_create` (see
//! [`crate::config`]).
use serde_json::{Map, Value};

use crate::params::{ParamError, Params};

/// `bdev_null_create` and `bdev_malloc_create`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalParams {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
    pub uuid: Option<[u8; 16]>,
}

const NULL_PARAMS: &[&str] = &[
    "name",
    "num_blocks",
    "block_size",
    "uuid",
    "md_size",
    "dif_type",
    "dif_is_head_of_md",
    "dif_pi_format",
    "physical_block_size",
];
const MALLOC_PARAMS: &[&str] = &[
    "name",
    "num_blocks",
    "block_size",
    "uuid",
    "optimal_io_boundary",
    "md_size",
    "md_interleave",
    "dif_type",
    "dif_is_head_of_md",
    "dif_pi_format",
    "physical_block_size",
];

/// `bdev_null_create`.
pub(crate) fn null_create(obj: &Map<String, Value>) -> Result<LocalParams, ParamError> {
    local(Params::with_known("bdev_null_create", obj, NULL_PARAMS)?)
}

/// `bdev_malloc_create`, with its `optimal_io_boundary` when not 0 (which
/// is ignored: the caller warns).
pub(crate) fn malloc_create(
    obj: &Map<String, Value>,
) -> Result<(LocalParams, Option<u64>), ParamError> {
    let p = Params::with_known("bdev_malloc_create", obj, MALLOC_PARAMS)?;
    let boundary = p.u64_opt("optimal_io_boundary")?.filter(|&b| b != 0);
    Ok((local(p)?, boundary))
}

fn local(p: Params<'_>) -> Result<LocalParams, ParamError> {
    no_metadata(&p)?;
    let block_size = p.required("block_size", p.u32_opt("block_size")?)?;
    // SPDK's client and save_config write it; only the logical block size
    // is modelled.
    if let Some(n) = p
        .u32_opt("physical_block_size")?
        .filter(|&n| n != 0 && n != block_size)
    {
        return Err(p.bad(
            "physical_block_size",
            format!("{n}: only 0 or the block size ({block_size}) is supported"),
        ));
    }
    Ok(LocalParams {
        name: p.name(false)?.unwrap_or_default().to_string(),
        num_blocks: p.required("num_blocks", p.u64_opt("num_blocks")?)?,
        block_size,
        uuid: p.uuid_opt("uuid")?,
    })
}

/// Metadata and protection information: only their "none" values.
fn no_metadata(p: &Params<'_>) -> Result<(), ParamError> {
    if let Some(n) = p.u32_opt("md_size")?.filter(|&n| n != 0) {
        return Err(p.bad(
            "md_size",
            format!("{n}: metadata is not supported (only 0)"),
        ));
    }
    if let Some(n) = p.u32_opt("dif_type")?.filter(|&n| n != 0) {
        return Err(p.bad(
            "dif_type",
            format!("{n}: protection information is not supported (only 0)"),
        ));
    }
    if let Some(n) = p.u32_opt("dif_pi_format")?.filter(|&n| n != 0) {
        return Err(p.bad(
            "dif_pi_format",
            format!("{n}: protection information is not supported (only 0)"),
        ));
    }
    if p.bool_opt("md_interleave")? == Some(true) {
        return Err(p.bad(
            "md_interleave",
            "true: metadata is not supported (only false)",
        ));
    }
    if p.bool_opt("dif_is_head_of_md")? == Some(true) {
        return Err(p.bad(
            "dif_is_head_of_md",
            "true: protection information is not supported (only false)",
        ));
    }
    Ok(())
}
