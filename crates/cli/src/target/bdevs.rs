//! The target's bdevs in one [`Registry`], whether the configuration made
//! them (quick flags, `-c`) or JSON-RPC: each with the
//! `{"method", "params"}` entry that makes it again (`save_config`), and
//! claimed by the subsystem whose namespace it is.
use pollux_bdev::config::{Entry, LocalParams};
use pollux_bdev::{Bdev, Registry, RegistryError};
use pollux_nvmf::TargetConfig;
use serde_json::{json, Value};

use super::TargetArgs;

/// Who claims a namespace's bdev (what a refused delete names).
pub fn claimer(nqn: &str) -> String {
    format!("subsystem {nqn}")
}

/// The config entry of quick mode's bdev `b`.
fn quick_entry(a: &TargetArgs, b: &Bdev) -> Value {
    let i = b.info();
    let local = |name: &str| LocalParams {
        name: name.to_string(),
        num_blocks: i.num_blocks,
        block_size: i.block_size,
        uuid: Some(i.uuid),
    };
    match i.backend {
        "null" => Entry::Null(local(&i.name)).saved_config(std::slice::from_ref(b)),
        "ram" => Entry::Malloc(local(&i.name)).saved_config(std::slice::from_ref(b)),
        "uring" => json!({"method": "bdev_uring_create", "params": {
            "name": i.name, "filename": a.uring.clone().unwrap_or_default(),
            "block_size": i.block_size, "uuid": i.uuid_string()}}),
        _ => crate::rpc::trid_entry("Nvme0", a.nvme.as_deref().unwrap_or_default()),
    }
}

/// The registry of `cfg`'s bdevs, each namespace's bdev claimed by its
/// subsystem; `json`: the `-c` file's text, if any.
pub fn registry(
    a: &TargetArgs,
    cfg: &TargetConfig,
    json: Option<&str>,
) -> Result<Registry, RegistryError> {
    let entries = json.map(crate::rpc::bdev_entries).unwrap_or_default();
    let r = crate::rpc::registry_of(&cfg.bdevs, &entries, |b| quick_entry(a, b))?;
    for s in &cfg.subsystems {
        for ns in &s.namespaces {
            r.claim(&ns.bdev, &claimer(&s.nqn))?;
        }
    }
    Ok(r)
}
