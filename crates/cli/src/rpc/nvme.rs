//! The NVMe controller methods (`bdev_nvme_*`), with SPDK's parameters
//! and results: `bdev_nvme_attach_controller` (the names of its bdevs,
//! `<name>n<nsid>`) and `bdev_nvme_detach_controller` (`true`).
use pollux_rpc::{params, Methods, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::app::{lock, App};
use super::bdev::{controller_bdevs, create, registry_error};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetachParams {
    name: String,
    // SPDK's selectors of one path of a multipath controller: a controller
    // here has one path, so they are accepted and must match nothing else.
    #[serde(default)]
    #[allow(dead_code)]
    trtype: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    traddr: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    adrfam: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    trsvcid: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    subnqn: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    hostaddr: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    hostsvcid: Option<String>,
}

fn detach(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let d: DetachParams = params(p)?;
    let names = controller_bdevs(app, &d.name);
    if names.is_empty() {
        return Err(RpcError::errno(
            libc::ENODEV,
            format!("Failed to find NVMe controller {}", d.name),
        ));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let bdevs = app.registry.remove_all(&refs).map_err(registry_error)?;
    // The controller closes after its bdevs.
    drop(bdevs);
    if let Some(o) = &app.opener {
        lock(o).detach(&d.name);
    }
    Ok(Value::Bool(true))
}

pub fn add(m: &mut Methods, app: &App) {
    if app.opener.is_none() {
        return;
    }
    let a = app.clone();
    m.add("bdev_nvme_attach_controller", move |p| {
        let names = create(&a, "bdev_nvme_attach_controller", p, None)?;
        Ok(json!(names))
    });
    let a = app.clone();
    m.add("bdev_nvme_detach_controller", move |p| detach(&a, p));
}
