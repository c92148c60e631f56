//! The NVMe controller methods (`bdev_nvme_*`), with SPDK's parameters
//! and results:
//!
//! | method | result |
//! |---|---|
//! | `bdev_nvme_attach_controller` | the names of its bdevs (`<name>n<nsid>`) |
//! | `bdev_nvme_detach_controller` | `true` |
//! | `bdev_nvme_get_controllers` | `[{name, ctrlrs: [{state, trid, cntlid, host}, ...]}]`, one `ctrlrs` entry per path |
//! | `bdev_nvme_set_multipath_policy` | `true` |
//!
//! # Paths (SPDK's multipath mode)
//! `bdev_nvme_attach_controller` of a controller name in use with
//! `"multipath": "multipath"` adds a path to it: the controller's bdev
//! becomes one namespace over every path (see `nvme_open.rs`), as from a
//! `-c` file. Refused as SPDK refuses them: without the mode, -17
//! (EEXIST); with `"disable"` or a path the controller has already,
//! -114 (EALREADY); another `subnqn` or `hostnqn`, -22 (EINVAL, naming
//! the controller's); a path to another namespace (other NGUID, EUI-64,
//! UUID or size), -22 naming the path and what differs; SPDK's
//! `"failover"` mode, -22. `bdev_nvme_detach_controller` with SPDK's
//! selectors (`trtype`, `traddr`, `adrfam`, `trsvcid`, `subnqn`,
//! `hostaddr`, `hostsvcid`: those given must all match) removes the
//! paths that match (none: -19, ENODEV), the controller with its bdev
//! when no path is left.
//!
//! A path is added or removed by opening the controller again over the
//! new set of paths and swapping the bdev in the registry (same name, same
//! UUID), all or nothing: the old one keeps serving if anything fails. So
//! the bdev must be unused: not a namespace of a subsystem and not open
//! (-16, EBUSY, naming who uses it). Changing the paths of a bdev in use
//! (live queue pairs) is not done.
//!
//! `bdev_nvme_set_multipath_policy` sets the policy of the bdev's
//! controller (`policy` active_passive or active_active, `selector`
//! round_robin or queue_depth, `rr_min_io` only 1): one open over several
//! paths is opened again with it (so also only while unused); one of one
//! path keeps it for when paths are added. As in SPDK, `save_config` does
//! not write it. `bdev_get_bdevs` shows it (`driver_specific`:
//! `mp_policy`, `selector`, `rr_min_io`).
use pollux_bdev::config::{multipath_mode, Entry, NvmeAttach};
use pollux_bdev::RegistryError;
use pollux_host::{Policy, Selector};
use pollux_rpc::{params, Methods, RpcError};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::app::{einval, lock, App};
use super::bdev::{config_error, controller_bdevs, create, registry_error};
use crate::nvme_open::OpenError;

const ATTACH: &str = "bdev_nvme_attach_controller";

/// `bdev_nvme_attach_controller`: a new controller, or a path added to
/// one (see the module docs).
fn attach(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let new_path = match p {
        Some(Value::Object(obj)) => {
            let name = obj.get("name").and_then(Value::as_str).unwrap_or("");
            let bdevs = controller_bdevs(app, name);
            if bdevs.is_empty() {
                None
            } else {
                let mut w = Vec::new();
                match Entry::decode(ATTACH, obj, &mut w).map_err(config_error)? {
                    Some(Entry::NvmeAttach(a)) => Some((a, bdevs)),
                    _ => None,
                }
            }
        }
        _ => None,
    };
    let names = match new_path {
        Some((a, bdevs)) => add_path(app, a, &bdevs)?,
        None => create(app, ATTACH, p, None)?,
    };
    Ok(json!(names))
}

/// A parameter as text (numbers too: `trsvcid` may be either).
fn param(a: &NvmeAttach, key: &str) -> Option<String> {
    match a.params.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The controller `name` (bdevs `bdevs`) as its config entries say: one
/// entry, its paths in `paths`.
fn current(app: &App, name: &str, bdevs: &[String]) -> Result<NvmeAttach, RpcError> {
    let mut list = Vec::new();
    for e in app.registry.entries_of(&bdevs[0]) {
        let obj = e["params"].as_object().cloned().unwrap_or_default();
        let mut w = Vec::new();
        if let Ok(Some(Entry::NvmeAttach(a))) = Entry::decode(ATTACH, &obj, &mut w) {
            list.push(a);
        }
    }
    NvmeAttach::of_paths(list).ok_or_else(|| {
        RpcError::internal(format!(
            "NVMe controller {name}: its configuration is not known"
        ))
    })
}

fn add_path(app: &App, a: NvmeAttach, bdevs: &[String]) -> Result<Vec<String>, RpcError> {
    let name = a.name.clone();
    match multipath_mode(&a) {
        Ok(Some(true)) => {}
        Ok(Some(false)) => {
            return Err(RpcError::errno(
                libc::EALREADY,
                format!("A controller named {name} already exists and multipath is disabled"),
            ))
        }
        Ok(None) => {
            return Err(RpcError::errno(
                libc::EEXIST,
                format!("A controller named {name} already exists"),
            ))
        }
        Err(why) => return Err(einval(format!("{ATTACH} '{name}': {why}"))),
    }
    let cur = current(app, &name, bdevs)?;
    let same = |k: &str, p: &NvmeAttach| param(&a, k) == param(p, k);
    if cur.each_path().iter().any(|p| {
        a.trtype.eq_ignore_ascii_case(&p.trtype)
            && a.traddr == p.traddr
            && ["trsvcid", "hostaddr", "hostsvcid"]
                .iter()
                .all(|k| same(k, p))
    }) {
        return Err(RpcError::errno(
            libc::EALREADY,
            format!("A controller named {name} already exists with the specified network path"),
        ));
    }
    for key in ["subnqn", "hostnqn"] {
        if !same(key, &cur) {
            return Err(einval(format!(
                "A controller named {name} already exists, but uses a different {key} ({})",
                param(&cur, key).unwrap_or_default()
            )));
        }
    }
    if bdevs.len() != 1 {
        return Err(einval(format!(
            "A controller named {name} already exists with {} namespaces ({}): a path is added to a controller of one namespace only",
            bdevs.len(),
            bdevs.join(", ")
        )));
    }
    let mut new = cur;
    new.add_path(a);
    reopen(app, &name, bdevs, &new)
}

/// Opens controller `name` again as `new` (its paths) and swaps its
/// bdevs `old` for the new ones in the registry, all or nothing (see the
/// module docs). The new bdev of `old[0]`'s name keeps its UUID.
fn reopen(
    app: &App,
    name: &str,
    old: &[String],
    new: &NvmeAttach,
) -> Result<Vec<String>, RpcError> {
    let refs: Vec<&str> = old.iter().map(String::as_str).collect();
    let busy = |e: RegistryError| {
        match e {
        RegistryError::Claimed { .. } | RegistryError::Open(_) => RpcError::errno(
            libc::EBUSY,
            format!(
                "NVMe controller {name}: {e}: its paths change only while its bdev is unused (not a namespace, not open)"
            ),
        ),
        e => registry_error(e),
    }
    };
    app.registry.check_unused(&refs).map_err(busy)?;
    let uuid = app.registry.get(&old[0]).map(|b| b.info().uuid);
    let Some(o) = &app.opener else {
        return Err(einval("this app does not attach NVMe controllers"));
    };
    let mut op = lock(o);
    let taken = op.take(name);
    let made = match op.attach(new) {
        Ok(m) => m,
        Err(e) => {
            op.restore(taken);
            return Err(open_error(name, e));
        }
    };
    let mut bdevs = Vec::with_capacity(made.len());
    for b in made {
        let b = match uuid {
            Some(u) if b.name() == old[0] => b.with_uuid(u),
            _ => Ok(b),
        };
        match b {
            Ok(b) => bdevs.push(b),
            Err(e) => {
                drop(bdevs);
                drop(op.take(name));
                op.restore(taken);
                return Err(RpcError::internal(e.to_string()));
            }
        }
    }
    let saved = Entry::NvmeAttach(new.clone()).saved_configs(&bdevs);
    let names: Vec<String> = bdevs.iter().map(|b| b.name().to_string()).collect();
    let pairs = bdevs
        .into_iter()
        .map(|b| (b.name().to_string(), b))
        .collect();
    match app.registry.replace(&refs, pairs, saved) {
        Ok(gone) => {
            // The old controllers close after their bdevs.
            drop(gone);
            drop(taken);
            tracing::info!(
                controller = name,
                paths = new.paths.len() + 1,
                "NVMe controller paths changed"
            );
            Ok(names)
        }
        Err(e) => {
            drop(op.take(name));
            op.restore(taken);
            Err(busy(e))
        }
    }
}

/// A controller that would not open: a path to another namespace is
/// SPDK's -22 (EINVAL, "Namespaces are not identical"), others -19.
fn open_error(name: &str, e: OpenError) -> RpcError {
    let code = if e.wrong_path {
        libc::EINVAL
    } else {
        libc::ENODEV
    };
    RpcError::errno(code, format!("NVMe controller {name}: {}", e.why))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetachParams {
    name: String,
    // SPDK's selectors of paths of a multipath controller (given ones
    // must all match).
    #[serde(default)]
    trtype: Option<String>,
    #[serde(default)]
    traddr: Option<String>,
    #[serde(default)]
    adrfam: Option<String>,
    #[serde(default)]
    trsvcid: Option<String>,
    #[serde(default)]
    subnqn: Option<String>,
    #[serde(default)]
    hostaddr: Option<String>,
    #[serde(default)]
    hostsvcid: Option<String>,
}

impl DetachParams {
    /// The selectors given, by parameter name.
    fn selectors(&self) -> Vec<(&'static str, &str)> {
        [
            ("trtype", &self.trtype),
            ("traddr", &self.traddr),
            ("adrfam", &self.adrfam),
            ("trsvcid", &self.trsvcid),
            ("subnqn", &self.subnqn),
            ("hostaddr", &self.hostaddr),
            ("hostsvcid", &self.hostsvcid),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

/// Whether path `p` matches every selector.
fn matches(p: &NvmeAttach, sel: &[(&str, &str)]) -> bool {
    sel.iter().all(|&(k, want)| match k {
        "trtype" => p.trtype.eq_ignore_ascii_case(want),
        "traddr" => p.traddr.as_deref() == Some(want),
        "adrfam" => param(p, k).is_some_and(|v| v.eq_ignore_ascii_case(want)),
        k => param(p, k).as_deref() == Some(want),
    })
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
    let sel = d.selectors();
    if !sel.is_empty() {
        let paths = current(app, &d.name, &names)?.each_path();
        let total = paths.len();
        let keep: Vec<NvmeAttach> = paths.into_iter().filter(|p| !matches(p, &sel)).collect();
        if keep.len() == total {
            let what: Vec<String> = sel.iter().map(|(k, v)| format!("{k} {v}")).collect();
            return Err(RpcError::errno(
                libc::ENODEV,
                format!(
                    "No such device: no path of NVMe controller {} has {}",
                    d.name,
                    what.join(", ")
                ),
            ));
        }
        if let Some(rest) = NvmeAttach::of_paths(keep) {
            reopen(app, &d.name, &names, &rest)?;
            return Ok(Value::Bool(true));
        }
        // No path left: the controller goes.
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetControllersParams {
    #[serde(default)]
    name: Option<String>,
}

/// SPDK's spelling of a transport type.
fn trtype_name(t: &str) -> String {
    match t.to_ascii_lowercase().as_str() {
        "tcp" => "TCP".into(),
        "pcie" => "PCIe".into(),
        "rdma" => "RDMA".into(),
        _ => t.to_string(),
    }
}

/// SPDK's `trid` object of a path: the keys it was attached with.
fn trid_json(p: &NvmeAttach) -> Value {
    let mut t = Map::new();
    t.insert("trtype".into(), trtype_name(&p.trtype).into());
    if let Some(f) = param(p, "adrfam") {
        let f = match f.to_ascii_lowercase().as_str() {
            "ipv4" => "IPv4".to_string(),
            "ipv6" => "IPv6".to_string(),
            _ => f,
        };
        t.insert("adrfam".into(), f.into());
    }
    if let Some(a) = &p.traddr {
        t.insert("traddr".into(), a.clone().into());
    }
    for k in ["trsvcid", "subnqn"] {
        if let Some(v) = param(p, k) {
            t.insert(k.into(), v.into());
        }
    }
    Value::Object(t)
}

/// `bdev_nvme_get_controllers`: every controller (or `name`), each path
/// an entry of its `ctrlrs`, in order.
fn get_controllers(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let g: GetControllersParams = params(p)?;
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for bdev in app.registry.names_where(|c| c["method"] == ATTACH) {
        let entries = app.registry.entries_of(&bdev);
        let Some(name) = entries
            .first()
            .and_then(|e| e["params"]["name"].as_str())
            .map(str::to_string)
        else {
            continue;
        };
        if seen.contains(&name) || g.name.as_ref().is_some_and(|n| *n != name) {
            continue;
        }
        let paths = current(app, &name, &[bdev])?.each_path();
        let states = match &app.opener {
            Some(o) => lock(o).paths_of(&name),
            None => Vec::new(),
        };
        let ctrlrs: Vec<Value> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut c = Map::new();
                if let Some(s) = states.get(i) {
                    let state = if s.failed { "failed" } else { "enabled" };
                    c.insert("state".into(), state.into());
                }
                c.insert("trid".into(), trid_json(p));
                if let Some(s) = states.get(i) {
                    c.insert("cntlid".into(), s.cntlid.into());
                }
                c.insert(
                    "host".into(),
                    json!({
                        "nqn": param(p, "hostnqn").unwrap_or_default(),
                        "addr": param(p, "hostaddr").unwrap_or_default(),
                        "svcid": param(p, "hostsvcid").unwrap_or_default(),
                    }),
                );
                Value::Object(c)
            })
            .collect();
        out.push(json!({ "name": name, "ctrlrs": ctrlrs }));
        seen.push(name);
    }
    if let (Some(n), true) = (&g.name, out.is_empty()) {
        return Err(RpcError::errno(
            libc::ENODEV,
            format!("No such device: no NVMe controller {n}"),
        ));
    }
    Ok(Value::Array(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyParams {
    /// The bdev's name (SPDK's).
    name: String,
    policy: String,
    #[serde(default)]
    selector: Option<String>,
    #[serde(default)]
    rr_min_io: Option<u32>,
}

/// `bdev_nvme_set_multipath_policy`: the path policy of an NVMe bdev's
/// controller, applied by opening it again (so only while the bdev is
/// unused) if it is open over several paths, else kept for when it is.
fn set_policy(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let q: PolicyParams = params(p)?;
    let bad = |e: String| RpcError::invalid_params(format!("Invalid parameters: {e}"));
    let policy: Policy = q.policy.parse().map_err(bad)?;
    let selector = match (&q.selector, policy) {
        (Some(_), Policy::ActivePassive) => {
            return Err(einval("selector only works in active_active mode"))
        }
        (Some(s), _) => s.parse::<Selector>().map_err(bad)?,
        (None, _) => Selector::RoundRobin,
    };
    if q.rr_min_io.is_some_and(|n| n != 1) {
        return Err(einval(
            "rr_min_io: only 1 is supported (round robin moves to the next path at each I/O)",
        ));
    }
    let ctrl = app
        .registry
        .entries_of(&q.name)
        .first()
        .filter(|e| e["method"] == ATTACH)
        .and_then(|e| e["params"]["name"].as_str().map(str::to_string))
        .ok_or_else(|| {
            RpcError::errno(
                libc::ENODEV,
                format!("No such device: no NVMe bdev {}", q.name),
            )
        })?;
    let Some(o) = &app.opener else {
        return Err(einval("this app does not attach NVMe controllers"));
    };
    let want = (policy, selector);
    let (prev, open) = {
        let mut op = lock(o);
        (op.set_policy(&ctrl, Some(want)), op.open_policy(&ctrl))
    };
    if open.is_some_and(|p| p != want) {
        let bdevs = controller_bdevs(app, &ctrl);
        let r = current(app, &ctrl, &bdevs).and_then(|cur| reopen(app, &ctrl, &bdevs, &cur));
        if let Err(e) = r {
            lock(o).set_policy(&ctrl, prev);
            return Err(e);
        }
    }
    Ok(Value::Bool(true))
}

pub fn add(m: &mut Methods, app: &App) {
    let a = app.clone();
    m.add("bdev_nvme_get_controllers", move |p| get_controllers(&a, p));
    if app.opener.is_none() {
        return;
    }
    let a = app.clone();
    m.add(ATTACH, move |p| attach(&a, p));
    let a = app.clone();
    m.add("bdev_nvme_detach_controller", move |p| detach(&a, p));
    let a = app.clone();
    m.add("bdev_nvme_set_multipath_policy", move |p| set_policy(&a, p));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(port: Value) -> NvmeAttach {
        let obj = json!({"name": "Nvme0", "trtype": "tcp", "traddr": "10.0.0.1",
            "adrfam": "ipv4", "trsvcid": port, "subnqn": "nqn.2024-01.io.pollux:a"});
        let mut w = Vec::new();
        match Entry::decode(ATTACH, obj.as_object().unwrap(), &mut w) {
            Ok(Some(Entry::NvmeAttach(a))) => a,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn detach_selectors_match_as_spdk_compares_them() {
        // trsvcid as a string or a number; trtype and adrfam in any case.
        for p in [path("4420".into()), path(4420.into())] {
            assert!(matches(&p, &[]));
            assert!(matches(&p, &[("trtype", "TCP"), ("trsvcid", "4420")]));
            assert!(matches(&p, &[("adrfam", "IPv4"), ("traddr", "10.0.0.1")]));
            assert!(!matches(&p, &[("trsvcid", "4421")]));
            assert!(!matches(&p, &[("trsvcid", "4420"), ("traddr", "10.0.0.2")]));
            // A selector the path was attached without matches nothing.
            assert!(!matches(&p, &[("hostaddr", "10.0.0.9")]));
        }
        assert_eq!(
            trid_json(&path("4420".into())),
            json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "10.0.0.1",
                   "trsvcid": "4420", "subnqn": "nqn.2024-01.io.pollux:a"})
        );
    }
}
