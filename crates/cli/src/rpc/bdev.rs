//! The bdev methods, with SPDK's parameters and results. Creation decodes
//! its parameters with the bdev crate's decoder of `-c` files
//! (`pollux_bdev::config::Entry`), so an RPC and a config entry of the
//! same method make the same bdev; every bdev goes into the app's
//! [`Registry`](pollux_bdev::Registry) with the entry that made it.
//!
//! | method | result |
//! |---|---|
//! | `bdev_null_create`, `bdev_malloc_create`, `bdev_uring_create` | the bdev's name |
//! | `bdev_nvme_attach_controller` | the names of its bdevs (`<name>n<nsid>`) |
//! | `bdev_*_delete`, `bdev_nvme_detach_controller` | `true` |
//!
//! (`bdev_nvme_*` are served by `nvme.rs`, with this file's creation.)
//! | `bdev_get_bdevs` | `[{name, aliases, product_name, block_size, num_blocks, uuid, claimed, ...}]` |
//! | `bdev_get_iostat` | `{tick_rate, ticks, bdevs: [{name, bytes_read, num_read_ops, ...}]}` |
//!
//! Deleting a bdev that something claimed (a namespace) is refused with
//! -16 (EBUSY) naming the claimer.
use pollux_bdev::config::{ConfigError, Entry, NvmeAttach};
use pollux_bdev::{Bdev, RegistryError};
use pollux_rpc::{params, Methods, RpcError};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::app::{einval, lock, App};
use super::framework::{ticks, TICK_RATE};

/// A bdev crate error as SPDK's handlers answer: parameters -32602 (the
/// message names method and parameter), a name in use -17 (EEXIST),
/// creation failures -22 (EINVAL), an NVMe controller that would not open
/// -19 (ENODEV).
pub(super) fn config_error(e: ConfigError) -> RpcError {
    match e {
        ConfigError::Param(p) => RpcError::invalid_params(format!("Invalid parameters: {p}")),
        ConfigError::DuplicateName(n) => {
            RpcError::errno(libc::EEXIST, format!("bdev '{n}' already exists"))
        }
        ConfigError::Attach { .. } => RpcError::errno(libc::ENODEV, e.to_string()),
        e => einval(e.to_string()),
    }
}

pub(super) fn registry_error(e: RegistryError) -> RpcError {
    let code = match e {
        RegistryError::Exists(_) => libc::EEXIST,
        RegistryError::NotFound(_) => libc::ENODEV,
        RegistryError::Claimed { .. } | RegistryError::Open(_) => libc::EBUSY,
    };
    RpcError::errno(code, e.to_string())
}

/// `params` as an object (absent: empty), for the bdev crate's decoder.
fn object(method: &str, p: Option<&Value>) -> Result<Map<String, Value>, RpcError> {
    match p {
        None => Ok(Map::new()),
        Some(Value::Object(o)) => Ok(o.clone()),
        Some(_) => Err(RpcError::invalid_params(format!(
            "Invalid parameters: {method}: params must be an object"
        ))),
    }
}

/// Decodes and creates the bdevs of `method`, and adds them to the
/// registry with their config entry. `name_prefix`: for an unnamed bdev
/// (SPDK's malloc makes up `Malloc<k>`).
pub(super) fn create(
    app: &App,
    method: &str,
    p: Option<&Value>,
    name_prefix: Option<&str>,
) -> Result<Vec<String>, RpcError> {
    let mut obj = object(method, p)?;
    if let Some(prefix) = name_prefix {
        if obj.get("name").is_none_or(Value::is_null) {
            obj.insert("name".into(), app.registry.free_name(prefix).into());
        }
    }
    let mut warnings = Vec::new();
    let entry = Entry::decode(method, &obj, &mut warnings)
        .map_err(config_error)?
        .ok_or_else(|| RpcError::internal(format!("{method} creates nothing")))?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    if let Entry::NvmeAttach(a) = &entry {
        if !controller_bdevs(app, &a.name).is_empty() {
            return Err(RpcError::errno(
                libc::EEXIST,
                format!("A controller named {} already exists", a.name),
            ));
        }
    } else if app.registry.contains(entry.name()) {
        return Err(RpcError::errno(
            libc::EEXIST,
            format!("bdev '{}' already exists", entry.name()),
        ));
    }
    let opener = app.opener.clone();
    let made = entry
        .create(&mut |att: &NvmeAttach| match &opener {
            Some(o) => lock(o).attach(att).map_err(|e| e.why),
            None => Err("this app does not attach NVMe controllers".to_string()),
        })
        .map_err(config_error)?;
    let saved = entry.saved_configs(&made);
    let names: Vec<String> = made.iter().map(|b| b.name().to_string()).collect();
    let r = app.registry.insert_entries(
        made.into_iter()
            .map(|b| (b.name().to_string(), b))
            .collect(),
        saved,
    );
    if let Err(e) = r {
        if let (Entry::NvmeAttach(a), Some(o)) = (&entry, &opener) {
            lock(o).detach(&a.name);
        }
        return Err(registry_error(e));
    }
    Ok(names)
}

/// The bdevs of NVMe controller `name`, as the registry knows them.
pub(super) fn controller_bdevs(app: &App, name: &str) -> Vec<String> {
    app.registry.names_where(|c| {
        c["method"] == "bdev_nvme_attach_controller" && c["params"]["name"] == name
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameParam {
    name: String,
}

/// `bdev_<kind>_delete {name}`: only a bdev `create_method` made.
fn delete(app: &App, create_method: &str, p: Option<&Value>) -> Result<Value, RpcError> {
    let NameParam { name } = params(p)?;
    let made_by = app
        .registry
        .names_where(|c| c["method"] == create_method && c["params"]["name"] == name.as_str());
    if made_by.is_empty() {
        return Err(RpcError::errno(
            libc::ENODEV,
            format!("No such device: no bdev '{name}' made by {create_method}"),
        ));
    }
    app.registry.remove(&name).map_err(registry_error)?;
    Ok(Value::Bool(true))
}

/// SPDK's product names of its bdev modules.
fn product_name(backend: &str) -> &'static str {
    match backend {
        "null" => "Null disk",
        "ram" => "Malloc disk",
        "uring" => "URING bdev",
        "nvme" => "NVMe disk",
        _ => "pollux bdev",
    }
}

/// One entry of `bdev_get_bdevs`.
fn bdev_json(app: &App, name: &str, b: &Bdev) -> Value {
    let i = b.info();
    let c = &i.caps;
    let claimed_by = app.registry.claimed_by(name);
    let mut v = json!({
        "name": name,
        "aliases": [],
        "product_name": product_name(i.backend),
        "block_size": i.block_size,
        "num_blocks": i.num_blocks,
        "uuid": i.uuid_string(),
        "assigned_rate_limits": {
            "rw_ios_per_sec": 0,
            "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 0,
            "w_mbytes_per_sec": 0
        },
        "claimed": claimed_by.is_some(),
        "zoned": false,
        "supported_io_types": {
            "read": true,
            "write": true,
            "unmap": c.unmap,
            "flush": c.flush,
            "reset": c.reset,
            "compare": false,
            "compare_and_write": false,
            "abort": false,
            "seek_hole": false,
            "seek_data": false,
            "copy": false,
            "nvme_admin": c.nvme_passthru,
            "nvme_io": c.nvme_passthru,
            "write_zeroes": c.write_zeroes,
            "zcopy": false
        },
        "driver_specific": {}
    });
    if let Some((policy, selector)) = b.multipath_policy() {
        // SPDK's NVMe bdev's (without its per-path "nvme" list).
        let mut d = json!({ "mp_policy": policy.name() });
        if policy == pollux_host::Policy::ActiveActive {
            d["selector"] = selector.name().into();
            if selector == pollux_host::Selector::RoundRobin {
                d["rr_min_io"] = 1.into();
            }
        }
        v["driver_specific"] = d;
    }
    if let Some(by) = claimed_by {
        v["claim_type"] = "exclusive_write".into();
        v["claimed_by"] = by.into();
    }
    v
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetBdevsParams {
    #[serde(default)]
    name: Option<String>,
    /// Milliseconds to wait for the bdev to appear (SPDK's); bdevs here
    /// exist once created, so nothing is waited for.
    #[serde(default)]
    #[allow(dead_code)]
    timeout: Option<u64>,
}

fn get_bdevs(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let g: GetBdevsParams = params(p)?;
    let list = app.registry.list();
    let out: Vec<Value> = match &g.name {
        None => list.iter().map(|(n, b)| bdev_json(app, n, b)).collect(),
        Some(want) => {
            let hit = list
                .iter()
                .find(|(n, b)| n == want || b.info().uuid_string() == *want)
                .ok_or_else(|| RpcError::errno(libc::ENODEV, "No such device"))?;
            vec![bdev_json(app, &hit.0, &hit.1)]
        }
    };
    Ok(Value::Array(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IostatParams {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    per_channel: bool,
    #[serde(default)]
    #[allow(dead_code)]
    reset_mode: Option<String>,
}

/// One entry of `bdev_get_iostat`.
fn iostat_json(name: &str, b: &Bdev) -> Value {
    let s = b.stats();
    let mut v = json!({
        "name": name,
        "bytes_read": s.read_bytes,
        "num_read_ops": s.reads,
        "bytes_written": s.write_bytes,
        "num_write_ops": s.writes,
        // pollux counts flush, write zeroes, unmap, reset and passthrough
        // together, and the requests that failed.
        "num_other_ops": s.others,
        "num_io_errors": s.errors,
    });
    if let Some(l) = s.latency {
        v["latency_ns"] = json!({
            "count": l.count, "min": l.min_ns, "mean": l.mean_ns,
            "p50": l.p50_ns, "p99": l.p99_ns, "max": l.max_ns,
        });
    }
    v
}

fn get_iostat(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let g: IostatParams = params(p)?;
    if g.per_channel {
        return Err(RpcError::invalid_params(
            "Invalid parameters: per_channel: per-channel statistics are not kept (only the bdev's sums)",
        ));
    }
    let list = app.registry.list();
    let bdevs: Vec<Value> = match &g.name {
        None => list.iter().map(|(n, b)| iostat_json(n, b)).collect(),
        Some(want) => {
            let (n, b) = list
                .iter()
                .find(|(n, _)| n == want)
                .ok_or_else(|| RpcError::errno(libc::ENODEV, "No such device"))?;
            vec![iostat_json(n, b)]
        }
    };
    Ok(json!({ "tick_rate": TICK_RATE, "ticks": ticks(), "bdevs": bdevs }))
}

pub fn add(m: &mut Methods, app: &App) {
    let a = app.clone();
    m.add("bdev_get_bdevs", move |p| get_bdevs(&a, p));
    let a = app.clone();
    m.add("bdev_get_iostat", move |p| get_iostat(&a, p));
    if app.opener.is_none() {
        return;
    }
    for (create_method, delete_method, prefix) in [
        ("bdev_null_create", "bdev_null_delete", None),
        ("bdev_malloc_create", "bdev_malloc_delete", Some("Malloc")),
        ("bdev_uring_create", "bdev_uring_delete", None),
    ] {
        let a = app.clone();
        m.add(create_method, move |p| {
            let mut names = create(&a, create_method, p, prefix)?;
            Ok(names.pop().map(Value::String).unwrap_or(Value::Null))
        });
        let a = app.clone();
        m.add(delete_method, move |p| delete(&a, create_method, p));
    }
}
