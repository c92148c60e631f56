//! The `nvmf_*` JSON-RPC methods of `pollux target`, as SPDK's
//! `lib/nvmf/nvmf_rpc.c`: same method names, parameters (decoded with
//! `deny_unknown_fields`, so a misspelt one is named), defaults, results
//! and error codes, on `pollux_nvmf::Target`'s live API. SPDK parameters
//! pollux does not implement (TLS PSKs, a second target
//! `tgt_name`) are refused naming the parameter unless given their
//! default. ANA: `nvmf_create_subsystem` `ana_reporting`, `min_cntlid`,
//! `max_cntlid`; `nvmf_subsystem_add_ns` `uuid`, `nguid`, `eui64`,
//! `anagrpid`; `nvmf_subsystem_add_listener` `ana_state`;
//! `nvmf_subsystem_listener_set_ana_state`.
use std::net::SocketAddr;
use std::sync::Arc;

use pollux_nvmf::{
    parse_hex_id, parse_uuid, AnaState, ConfigError, LiveError, NsIds, SubsystemOptions, Target,
    TargetConfig,
};
use pollux_rpc::{params, Methods, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

/// A `LiveError` as SPDK's handlers answer it: an unknown subsystem is
/// -32602 "Unable to find subsystem with NQN ...", a bad value or a
/// listener there already -32602 naming it, a second transport -32603
/// "Transport type 'TCP' already exists", anything else `-errno` with the
/// reason.
fn live_err(e: LiveError) -> RpcError {
    match &e {
        LiveError::NoSubsystem { nqn } => {
            RpcError::invalid_params(format!("Unable to find subsystem with NQN {nqn}"))
        }
        LiveError::TransportExists => {
            RpcError::internal("Transport type 'TCP' already exists".to_string())
        }
        LiveError::ListenerExists { .. }
        | LiveError::InvalidNsid { .. }
        | LiveError::InvalidBdev { .. }
        | LiveError::InvalidSubsystem { .. }
        | LiveError::InvalidHost { .. }
        | LiveError::Key(_)
        | LiveError::InvalidAddress { .. }
        | LiveError::UnsupportedTransport { .. }
        | LiveError::TransportOptions(_) => RpcError::invalid_params(e.to_string()),
        _ => RpcError::errno(e.errno(), e.to_string()),
    }
}

/// A configuration reader's refusal of parameters: -32602, naming it.
fn config_err(e: ConfigError) -> RpcError {
    match e {
        ConfigError::Param(p) => RpcError::invalid_params(p.to_string()),
        e => RpcError::invalid_params(e.to_string()),
    }
}

/// Only the default target exists.
fn check_tgt(tgt_name: &Option<String>) -> Result<(), RpcError> {
    match tgt_name {
        None => Ok(()),
        Some(n) => Err(RpcError::invalid_params(format!(
            "Unable to find target {n} (tgt_name: pollux has one target)"
        ))),
    }
}

/// SPDK's `listen_address` object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenAddress {
    trtype: String,
    adrfam: Option<String>,
    traddr: String,
    trsvcid: Option<String>,
    /// Older clients send it; it must be empty.
    #[serde(default)]
    priority: Option<u32>,
}

impl ListenAddress {
    fn addr(&self) -> Result<SocketAddr, RpcError> {
        if self.priority.is_some_and(|p| p != 0) {
            return Err(RpcError::invalid_params(
                "listen_address.priority: not supported",
            ));
        }
        pollux_nvmf::listen_address(
            &self.trtype,
            self.adrfam.as_deref(),
            &self.traddr,
            self.trsvcid.as_deref(),
        )
        .map_err(live_err)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSubsystem {
    nqn: String,
    tgt_name: Option<String>,
    serial_number: Option<String>,
    model_number: Option<String>,
    #[serde(default)]
    allow_any_host: bool,
    #[serde(default)]
    max_namespaces: u32,
    #[serde(default)]
    ana_reporting: bool,
    min_cntlid: Option<u16>,
    max_cntlid: Option<u16>,
    max_discard_size_kib: Option<u64>,
    max_write_zeroes_size_kib: Option<u64>,
    #[serde(default)]
    passthrough: bool,
    #[serde(default)]
    enable_nssr: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nqn {
    nqn: String,
    tgt_name: Option<String>,
}

/// SPDK's `nvmf_subsystem_add_ns` `namespace` object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NsParams {
    bdev_name: String,
    #[serde(default)]
    nsid: u32,
    nguid: Option<String>,
    eui64: Option<String>,
    uuid: Option<String>,
    ptpl_file: Option<String>,
    anagrpid: Option<u32>,
    #[serde(default)]
    no_auto_visible: bool,
    #[serde(default)]
    hide_metadata: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNs {
    nqn: String,
    namespace: NsParams,
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveNs {
    nqn: String,
    nsid: u32,
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OptNqn {
    nqn: Option<String>,
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Listener {
    nqn: String,
    listen_address: ListenAddress,
    tgt_name: Option<String>,
    #[serde(default)]
    secure_channel: bool,
    ana_state: Option<String>,
    anagrpid: Option<u32>,
    sock_impl: Option<String>,
}

/// SPDK's `nvmf_subsystem_listener_set_ana_state` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetAnaState {
    nqn: String,
    listen_address: ListenAddress,
    ana_state: String,
    anagrpid: Option<u32>,
    tgt_name: Option<String>,
}

/// An `ana_state` by SPDK's names (what its RPC accepts).
fn ana_state(v: &str) -> Result<AnaState, RpcError> {
    match AnaState::from_name(v) {
        Some(st @ (AnaState::Optimized | AnaState::NonOptimized | AnaState::Inaccessible)) => {
            Ok(st)
        }
        _ => Err(RpcError::invalid_params(format!(
            "ana_state: '{v}': optimized, non_optimized or inaccessible"
        ))),
    }
}

/// The namespace identifiers of `nvmf_subsystem_add_ns`.
fn ns_ids(n: &NsParams) -> Result<NsIds, RpcError> {
    let bad = |k: &str, v: &str, what: &str| {
        RpcError::invalid_params(format!("namespace.{k}: '{v}' is not {what}"))
    };
    let mut ids = NsIds::default();
    if let Some(u) = &n.uuid {
        ids.uuid = Some(parse_uuid(u).ok_or_else(|| bad("uuid", u, "a UUID"))?);
    }
    if let Some(u) = &n.nguid {
        ids.nguid = Some(parse_hex_id(u).ok_or_else(|| bad("nguid", u, "32 hex digits"))?);
    }
    if let Some(u) = &n.eui64 {
        ids.eui64 = Some(parse_hex_id(u).ok_or_else(|| bad("eui64", u, "16 hex digits"))?);
    }
    Ok(ids)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Host {
    nqn: String,
    host: String,
    tgt_name: Option<String>,
    psk: Option<String>,
    dhchap_key: Option<String>,
    dhchap_ctrlr_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowAnyHost {
    nqn: String,
    allow_any_host: bool,
    tgt_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetTransports {
    trtype: Option<String>,
    tgt_name: Option<String>,
}

/// Parameters of SPDK's other transports (RDMA, VFIO-USER) and its iobuf
/// tuning, which SPDK's client sends to `nvmf_create_transport` (the
/// flags always, as false) and SPDK's TCP transport ignores: taken out
/// before the TCP options are read; a flag set is refused, a value given
/// is ignored with a warning.
fn other_transports_params(mut v: Value) -> Result<Value, RpcError> {
    const FLAGS: [&str; 5] = [
        "no_srq",
        "no_wr_batching",
        "disable_mappable_bar0",
        "disable_adaptive_irq",
        "disable_shadow_doorbells",
    ];
    const IGNORED: [&str; 9] = [
        "num_cqe",
        "max_srq_depth",
        "acceptor_backlog",
        "acceptor_poll_rate",
        "iobuf_small_cache_size",
        "iobuf_large_cache_size",
        "min_kato",
        "masked_oncs",
        "masked_fuses",
    ];
    let Some(o) = v.as_object_mut() else {
        return Ok(v);
    };
    for k in FLAGS {
        match o.remove(k) {
            None | Some(Value::Bool(false)) | Some(Value::Null) => {}
            Some(Value::Bool(true)) => {
                return Err(RpcError::invalid_params(format!(
                    "{k}: not supported by the TCP transport"
                )))
            }
            Some(x) => {
                return Err(RpcError::invalid_params(format!(
                    "Invalid parameters: {k}: expected a boolean, got {x}"
                )))
            }
        }
    }
    for k in IGNORED {
        if let Some(x) = o.remove(k) {
            if !x.is_null() {
                tracing::warn!("nvmf_create_transport: parameter '{k}' ignored ({x})");
            }
        }
    }
    Ok(v)
}

/// SPDK's `keyring_file_add_key`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFileParams {
    name: String,
    path: String,
}

/// A key's name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyName {
    name: String,
}

/// SPDK's keyring methods (the `keyring_file` module): keys by name for
/// `nvmf_subsystem_add_host`'s `dhchap_key` and `dhchap_ctrlr_key`.
fn register_keyring(methods: &mut Methods, target: &Arc<Target>) {
    let t = target.clone();
    methods.add("keyring_file_add_key", move |p| {
        let q: KeyFileParams = params(p)?;
        t.add_key(&q.name, std::path::Path::new(&q.path))
            .map_err(live_err)?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    methods.add("keyring_file_remove_key", move |p| {
        let q: KeyName = params(p)?;
        t.remove_key(&q.name).map_err(live_err)?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    methods.add("keyring_get_keys", move |_| Ok(Value::Array(t.keys())));
}

/// Refuses a parameter given that pollux does not implement.
fn unsupported(name: &str, given: bool) -> Result<(), RpcError> {
    if given {
        Err(RpcError::invalid_params(format!(
            "{name}: not supported by pollux"
        )))
    } else {
        Ok(())
    }
}

/// The bdev names of subsystem `nqn`'s namespaces (as listed).
fn ns_bdevs(t: &Target, nqn: &str) -> Vec<String> {
    t.subsystems()
        .iter()
        .filter(|s| s["nqn"] == nqn)
        .flat_map(|s| s["namespaces"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n["bdev_name"].as_str().map(str::to_string))
        .collect()
}

/// Registers the `nvmf_*` methods on `target`; `bdevs` are the target's
/// (a namespace's bdev is claimed by its subsystem while it is one).
pub fn register(methods: &mut Methods, target: Arc<Target>, bdevs: Arc<pollux_bdev::Registry>) {
    register_keyring(methods, &target);
    let t = target.clone();
    methods.add("nvmf_create_transport", move |p| {
        let v = p.cloned().unwrap_or_else(|| json!({}));
        if !v.is_object() {
            return Err(RpcError::invalid_params(
                "Invalid parameters: expected an object",
            ));
        }
        let tgt: Option<String> = v
            .get("tgt_name")
            .and_then(Value::as_str)
            .map(str::to_string);
        check_tgt(&tgt)?;
        let v = other_transports_params(v)?;
        // The parameters given over the options the target started with
        // (its command line's: `--sock-impl`, `--uring-*`,
        // `--max-queue-depth`, ...), as SPDK's over its defaults: those
        // are this target's defaults. The configuration file's reader:
        // same parameters and messages.
        let mut cfg = TargetConfig {
            transport: t.transport_options(),
            ..TargetConfig::default()
        };
        cfg.apply_entry(&json!({"method": "nvmf_create_transport", "params": v}))
            .map_err(config_err)?;
        t.create_transport(cfg.transport).map_err(live_err)?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    methods.add("nvmf_get_transports", move |p| {
        let q: GetTransports = params(p)?;
        check_tgt(&q.tgt_name)?;
        let all = t.transports();
        match q.trtype {
            None => Ok(Value::Array(all)),
            Some(tr) => {
                let one: Vec<Value> = all
                    .into_iter()
                    .filter(|x| {
                        x["trtype"]
                            .as_str()
                            .is_some_and(|s| s.eq_ignore_ascii_case(&tr))
                    })
                    .collect();
                if one.is_empty() {
                    return Err(RpcError::errno(
                        libc::ENODEV,
                        format!("Unable to find transport {tr}"),
                    ));
                }
                Ok(Value::Array(one))
            }
        }
    });
    let t = target.clone();
    methods.add("nvmf_create_subsystem", move |p| {
        let q: CreateSubsystem = params(p)?;
        check_tgt(&q.tgt_name)?;
        unsupported("passthrough", q.passthrough)?;
        unsupported("enable_nssr", q.enable_nssr)?;
        unsupported("max_discard_size_kib", q.max_discard_size_kib.is_some())?;
        unsupported(
            "max_write_zeroes_size_kib",
            q.max_write_zeroes_size_kib.is_some(),
        )?;
        let o = SubsystemOptions {
            serial_number: q.serial_number,
            model_number: q.model_number,
            allow_any_host: q.allow_any_host,
            max_namespaces: q.max_namespaces,
            ana_reporting: q.ana_reporting,
            min_cntlid: q.min_cntlid,
            max_cntlid: q.max_cntlid,
        };
        t.create_subsystem(&q.nqn, o).map_err(|e| match e {
            // SPDK: "Unable to create subsystem <nqn>" (-32603).
            LiveError::SubsystemExists { nqn } => RpcError::internal(format!(
                "Unable to create subsystem {nqn}: it already exists"
            )),
            e => live_err(e),
        })?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    let b = bdevs.clone();
    methods.add("nvmf_delete_subsystem", move |p| {
        let q: Nqn = params(p)?;
        check_tgt(&q.tgt_name)?;
        let names = ns_bdevs(&t, &q.nqn);
        t.delete_subsystem(&q.nqn).map_err(live_err)?;
        // Its namespaces' bdevs are free again.
        for n in names {
            b.release(&n);
        }
        Ok(Value::Bool(true))
    });
    for (name, add) in [
        ("nvmf_subsystem_add_listener", true),
        ("nvmf_subsystem_remove_listener", false),
    ] {
        let t = target.clone();
        methods.add(name, move |p| {
            let q: Listener = params(p)?;
            check_tgt(&q.tgt_name)?;
            unsupported("secure_channel", q.secure_channel)?;
            let ana = match (&q.ana_state, add) {
                (Some(v), true) => Some(ana_state(v)?),
                (Some(_), false) => {
                    return Err(RpcError::invalid_params(
                        "ana_state: only when adding a listener",
                    ))
                }
                (None, _) => None,
            };
            if let Some(s) = q.sock_impl.as_deref() {
                // One implementation for the whole target, chosen at start.
                let running = t.sock_impl().name();
                if s != running {
                    return Err(RpcError::invalid_params(format!(
                        "sock_impl: '{s}': this target's threads run '{running}' (pollux target --sock-impl posix|uring)"
                    )));
                }
            }
            let addr = q.listen_address.addr()?;
            if add {
                let real = t.add_listener(&q.nqn, addr).map_err(live_err)?;
                if let Some(st) = ana.filter(|&st| st != AnaState::Optimized) {
                    if let Err(e) = t.set_ana_state(&q.nqn, real, st, q.anagrpid) {
                        // As if never added.
                        let _ = t.remove_listener(&q.nqn, real);
                        return Err(live_err(e));
                    }
                }
            } else {
                t.remove_listener(&q.nqn, addr).map_err(live_err)?;
            }
            Ok(Value::Bool(true))
        });
    }
    for (name, add) in [
        ("nvmf_subsystem_add_host", true),
        ("nvmf_subsystem_remove_host", false),
    ] {
        let t = target.clone();
        methods.add(name, move |p| {
            let q: Host = params(p)?;
            check_tgt(&q.tgt_name)?;
            unsupported("psk", q.psk.is_some())?;
            if add {
                t.add_host_with_keys(
                    &q.nqn,
                    &q.host,
                    q.dhchap_key.as_deref(),
                    q.dhchap_ctrlr_key.as_deref(),
                )
                .map_err(live_err)?;
            } else {
                for (k, v) in [
                    ("dhchap_key", &q.dhchap_key),
                    ("dhchap_ctrlr_key", &q.dhchap_ctrlr_key),
                ] {
                    if v.is_some() {
                        return Err(RpcError::invalid_params(format!(
                            "{k}: not a parameter of nvmf_subsystem_remove_host"
                        )));
                    }
                }
                t.remove_host(&q.nqn, &q.host).map_err(live_err)?;
            }
            Ok(Value::Bool(true))
        });
    }
    let t = target.clone();
    methods.add("nvmf_subsystem_listener_set_ana_state", move |p| {
        let q: SetAnaState = params(p)?;
        check_tgt(&q.tgt_name)?;
        let st = ana_state(&q.ana_state)?;
        let addr = q.listen_address.addr()?;
        t.set_ana_state(&q.nqn, addr, st, q.anagrpid)
            .map_err(live_err)?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    methods.add("nvmf_subsystem_allow_any_host", move |p| {
        let q: AllowAnyHost = params(p)?;
        check_tgt(&q.tgt_name)?;
        t.allow_any_host(&q.nqn, q.allow_any_host)
            .map_err(live_err)?;
        Ok(Value::Bool(true))
    });
    let t = target.clone();
    methods.add("nvmf_get_subsystems", move |p| {
        let q: OptNqn = params(p)?;
        check_tgt(&q.tgt_name)?;
        let all = t.subsystems();
        match q.nqn {
            None => Ok(Value::Array(all)),
            Some(nqn) => {
                let one: Vec<Value> = all.into_iter().filter(|s| s["nqn"] == nqn).collect();
                if one.is_empty() {
                    // SPDK: -ENODEV, strerror's message.
                    return Err(RpcError::errno(libc::ENODEV, "No such device"));
                }
                Ok(Value::Array(one))
            }
        }
    });
    let t = target.clone();
    methods.add("nvmf_subsystem_get_controllers", move |p| {
        let q: Nqn = params(p)?;
        check_tgt(&q.tgt_name)?;
        Ok(Value::Array(
            t.subsystem_controllers(&q.nqn).map_err(live_err)?,
        ))
    });
    let t = target.clone();
    let b = bdevs.clone();
    methods.add("nvmf_subsystem_add_ns", move |p| {
        let q: AddNs = params(p)?;
        check_tgt(&q.tgt_name)?;
        let n = q.namespace;
        let ids = ns_ids(&n)?;
        if n.anagrpid.is_some_and(|g| g == 0 || g > 1024) {
            return Err(RpcError::invalid_params(format!(
                "namespace.anagrpid: {}: must be 1..=1024",
                n.anagrpid.unwrap_or(0)
            )));
        }
        unsupported("ptpl_file", n.ptpl_file.is_some())?;
        unsupported("no_auto_visible", n.no_auto_visible)?;
        unsupported("hide_metadata", n.hide_metadata)?;
        // The bdev is claimed first (a bdev is one namespace at a time),
        // released again if the subsystem refuses it.
        if let Some(by) = b.claimed_by(&n.bdev_name) {
            return Err(RpcError::invalid_params(format!(
                "namespace.bdev_name: bdev '{}' is already a namespace of {by}",
                n.bdev_name
            )));
        }
        let bdev = b
            .claim(&n.bdev_name, &crate::rpc::claimer(&q.nqn))
            .map_err(|e| RpcError::invalid_params(format!("namespace.bdev_name: {e}")))?;
        let nsid = (n.nsid != 0).then_some(n.nsid);
        match t.add_namespace_with(&q.nqn, bdev, nsid, ids, n.anagrpid.unwrap_or(0)) {
            Ok(nsid) => Ok(json!(nsid)),
            Err(e) => {
                b.release(&n.bdev_name);
                Err(live_err(e))
            }
        }
    });
    let t = target.clone();
    let b = bdevs.clone();
    methods.add("nvmf_subsystem_remove_ns", move |p| {
        let q: RemoveNs = params(p)?;
        check_tgt(&q.tgt_name)?;
        let bdev = t.remove_namespace(&q.nqn, q.nsid).map_err(live_err)?;
        b.release(bdev.name());
        Ok(Value::Bool(true))
    });
    let t = target;
    methods.add("nvmf_subsystem_get_qpairs", move |p| {
        let q: Nqn = params(p)?;
        check_tgt(&q.tgt_name)?;
        Ok(Value::Array(t.subsystem_qpairs(&q.nqn).map_err(live_err)?))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_nvmf::RuntimeOptions;

    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";

    fn call(m: &Methods, name: &str, p: Value) -> Result<Value, RpcError> {
        m.call(name, Some(&p))
    }

    /// A transport created live keeps the options the target was started
    /// with (its command line's) that the call does not set, and takes
    /// those it sets (before: every option not given was reset to its
    /// default but `sock_impl`, so `--uring-rx-buffers`, `--no-epoll-idle`,
    /// `--max-queue-depth`, ... were lost).
    #[test]
    fn a_live_transport_starts_from_the_targets_options() {
        let started = pollux_nvmf::TransportOptions {
            max_queue_depth: 32,
            uring_rx_buffers: 1024,
            uring_zcopy_threshold: 65536,
            uring_registered_buffers: 1 << 20,
            epoll_idle: false,
            incoming_cpu: true,
            max_connections: 100,
            send_iov: 16,
            busy_poll_us: 50,
            ..Default::default()
        };
        let cfg = TargetConfig {
            transport: started.clone(),
            ..TargetConfig::default()
        };
        let t = Arc::new(Target::start(cfg, &[0], RuntimeOptions::default()).unwrap());
        let mut m = Methods::new();
        register(&mut m, t.clone(), Arc::new(pollux_bdev::Registry::new()));
        // The registered buffers are set up when the threads start: a
        // change is refused by name.
        let e = call(
            &m,
            "nvmf_create_transport",
            json!({"trtype": "TCP", "uring_registered_buffers": 2097152}),
        )
        .unwrap_err();
        assert!(
            e.message.contains(
                "uring_registered_buffers 2097152: the target's threads were started with 1048576"
            ),
            "{}",
            e.message
        );
        // What SPDK's client sends for `nvmf_create_transport -t TCP -q 64
        // -u 16384`.
        let tr = json!({"trtype": "TCP", "max_queue_depth": 64, "io_unit_size": 16384,
            "no_srq": false, "c2h_success": true, "zcopy": false, "dif_insert_or_strip": false,
            "no_wr_batching": false, "disable_mappable_bar0": false, "disable_adaptive_irq": false,
            "disable_shadow_doorbells": false, "disable_command_passthru": false});
        assert_eq!(call(&m, "nvmf_create_transport", tr), Ok(json!(true)));
        let want = pollux_nvmf::TransportOptions {
            max_queue_depth: 64,
            io_unit_size: 16384,
            ..started
        };
        assert_eq!(t.transport_options(), want);
        let got = call(&m, "nvmf_get_transports", json!({})).unwrap();
        assert_eq!(got[0]["uring_registered_buffers"], 1 << 20, "{}", got[0]);
        t.shutdown().unwrap();
    }

    #[test]
    fn methods_take_spdks_params_and_answer_its_codes() {
        let t = Arc::new(
            Target::start(TargetConfig::default(), &[0], RuntimeOptions::default()).unwrap(),
        );
        let mut m = Methods::new();
        register(&mut m, t.clone(), Arc::new(pollux_bdev::Registry::new()));
        // What SPDK's client (spdk-rpc 26.9) sends for
        // `nvmf_create_transport -t TCP -m 8 -c 8192`, and io_unit_size.
        let tr = json!({"trtype": "TCP", "io_unit_size": 16384, "max_io_qpairs_per_ctrlr": 8, "in_capsule_data_size": 8192,
            "no_srq": false, "c2h_success": true, "zcopy": false, "dif_insert_or_strip": false, "no_wr_batching": false,
            "disable_mappable_bar0": false, "disable_adaptive_irq": false, "disable_shadow_doorbells": false,
            "disable_command_passthru": false});
        let e = call(
            &m,
            "nvmf_create_transport",
            json!({"trtype": "TCP", "no_srq": true}),
        )
        .unwrap_err();
        assert!(e.message.contains("no_srq"), "{}", e.message);
        assert_eq!(
            call(&m, "nvmf_create_transport", tr.clone()),
            Ok(json!(true))
        );
        let e = call(&m, "nvmf_create_transport", tr).unwrap_err();
        assert_eq!(e.code, -32603);
        assert_eq!(e.message, "Transport type 'TCP' already exists");
        let e = call(
            &m,
            "nvmf_create_transport",
            json!({"trtype": "TCP", "max_queue_dept": 1}),
        )
        .unwrap_err();
        assert_eq!(e.code, -32602);
        assert!(e.message.contains("max_queue_dept"), "{}", e.message);
        let got = call(&m, "nvmf_get_transports", json!({})).unwrap();
        assert_eq!(got[0]["io_unit_size"], 16384);
        assert_eq!(got[0]["max_io_qpairs_per_ctrlr"], 8);
        assert_eq!(got[0]["in_capsule_data_size"], 8192);
        // rpc.py nvmf_create_subsystem NQN -a -s SPDK00000000000001 -m 10
        let p = json!({"nqn": NQN, "allow_any_host": true, "serial_number": "SPDK00000000000001", "max_namespaces": 10});
        assert_eq!(
            call(&m, "nvmf_create_subsystem", p.clone()),
            Ok(json!(true))
        );
        assert_eq!(
            call(&m, "nvmf_create_subsystem", p).unwrap_err().code,
            -32603
        );
        let e = call(&m, "nvmf_create_subsystem", json!({"nqn": "bad nqn"})).unwrap_err();
        assert_eq!(e.code, -32602);
        let e = call(
            &m,
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "serial": "x"}),
        )
        .unwrap_err();
        assert!(e.message.contains("serial"), "{}", e.message);
        // (ANA reporting and controller ID ranges are taken now: a bad
        // range is refused naming it.)
        let e = call(
            &m,
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "min_cntlid": 9, "max_cntlid": 3}),
        )
        .unwrap_err();
        assert_eq!(e.code, -32602);
        assert!(
            e.message.contains("controller ID range 9-3"),
            "{}",
            e.message
        );
        // rpc.py nvmf_subsystem_add_listener NQN -t tcp -a 127.0.0.1 -s 0
        let l = json!({"nqn": NQN, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "0"}});
        assert_eq!(call(&m, "nvmf_subsystem_add_listener", l), Ok(json!(true)));
        let bound = t.listen_addrs()[0];
        let e = call(&m, "nvmf_subsystem_add_listener", json!({"nqn": NQN, "listen_address": {"trtype": "RDMA", "traddr": "127.0.0.1", "trsvcid": "4420"}})).unwrap_err();
        assert_eq!(e.code, -32602);
        assert!(e.message.contains("RDMA"), "{}", e.message);
        let e = call(&m, "nvmf_subsystem_add_listener", json!({"nqn": "nqn.2016-06.io.spdk:none", "listen_address": {"trtype": "TCP", "traddr": "127.0.0.1", "trsvcid": "0"}})).unwrap_err();
        assert_eq!(e.code, -32602);
        assert_eq!(
            e.message,
            "Unable to find subsystem with NQN nqn.2016-06.io.spdk:none"
        );
        assert_eq!(
            call(
                &m,
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": HOST})
            ),
            Ok(json!(true))
        );
        assert_eq!(
            call(
                &m,
                "nvmf_subsystem_allow_any_host",
                json!({"nqn": NQN, "allow_any_host": false})
            ),
            Ok(json!(true))
        );
        let s = call(&m, "nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
        assert_eq!(s[0]["allow_any_host"], false);
        assert_eq!(s[0]["hosts"], json!([{"nqn": HOST}]));
        assert_eq!(s[0]["serial_number"], "SPDK00000000000001");
        assert_eq!(s[0]["max_namespaces"], 10);
        assert_eq!(
            s[0]["listen_addresses"][0]["trsvcid"],
            bound.port().to_string()
        );
        let e = call(
            &m,
            "nvmf_get_subsystems",
            json!({"nqn": "nqn.2016-06.io.spdk:none"}),
        )
        .unwrap_err();
        assert_eq!(e.code, -libc::ENODEV);
        assert_eq!(
            call(&m, "nvmf_get_subsystems", json!({}))
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            call(&m, "nvmf_subsystem_get_controllers", json!({"nqn": NQN})),
            Ok(json!([]))
        );
        assert_eq!(
            call(&m, "nvmf_subsystem_get_qpairs", json!({"nqn": NQN})),
            Ok(json!([]))
        );
        let e = call(
            &m,
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": "nqn.2014-08.org.nvmexpress:uuid:other"}),
        )
        .unwrap_err();
        assert_eq!(e.code, -libc::ENOENT);
        assert_eq!(
            call(
                &m,
                "nvmf_subsystem_remove_host",
                json!({"nqn": NQN, "host": HOST})
            ),
            Ok(json!(true))
        );
        let l = json!({"nqn": NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": bound.port().to_string()}});
        assert_eq!(
            call(&m, "nvmf_subsystem_remove_listener", l),
            Ok(json!(true))
        );
        assert!(t.listen_addrs().is_empty());
        assert_eq!(
            call(&m, "nvmf_delete_subsystem", json!({"nqn": NQN})),
            Ok(json!(true))
        );
        let e = call(&m, "nvmf_delete_subsystem", json!({"nqn": NQN})).unwrap_err();
        assert_eq!(e.code, -32602);
        let e = call(
            &m,
            "nvmf_delete_subsystem",
            json!({"nqn": NQN, "tgt_name": "t2"}),
        )
        .unwrap_err();
        assert!(e.message.contains("tgt_name"), "{}", e.message);
        t.shutdown().unwrap();
    }

    /// SPDK's keyring and DH-HMAC-CHAP parameters: `keyring_file_add_key`,
    /// `nvmf_subsystem_add_host` with key names, the listing with names
    /// only.
    #[test]
    fn keyring_and_host_keys() {
        use std::os::unix::fs::PermissionsExt;
        let t = Arc::new(
            Target::start(TargetConfig::default(), &[0], RuntimeOptions::default()).unwrap(),
        );
        let mut m = Methods::new();
        register(&mut m, t.clone(), Arc::new(pollux_bdev::Registry::new()));
        let dir = std::env::temp_dir().join(format!("pollux-rpc-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key0");
        std::fs::write(
            &path,
            "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = path.display().to_string();
        assert_eq!(
            call(
                &m,
                "keyring_file_add_key",
                json!({"name": "key0", "path": p})
            ),
            Ok(json!(true))
        );
        let e = call(
            &m,
            "keyring_file_add_key",
            json!({"name": "key0", "path": p}),
        )
        .unwrap_err();
        assert!(e.message.contains("already"), "{}", e.message);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
        let e = call(
            &m,
            "keyring_file_add_key",
            json!({"name": "key1", "path": p}),
        )
        .unwrap_err();
        assert!(
            e.message.contains("key1") && e.message.contains("0604"),
            "{}",
            e.message
        );
        let keys = call(&m, "keyring_get_keys", json!({})).unwrap();
        assert_eq!(keys[0]["name"], "key0");
        assert!(!keys.to_string().contains("DHHC"), "{keys}");

        let tr = json!({"trtype": "TCP"});
        call(&m, "nvmf_create_transport", tr).unwrap();
        call(&m, "nvmf_create_subsystem", json!({"nqn": NQN})).unwrap();
        let e = call(
            &m,
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST, "dhchap_key": "nokey"}),
        )
        .unwrap_err();
        assert!(e.message.contains("no key 'nokey'"), "{}", e.message);
        assert_eq!(
            call(
                &m,
                "nvmf_subsystem_add_host",
                json!({"nqn": NQN, "host": HOST, "dhchap_key": "key0", "dhchap_ctrlr_key": "key0"})
            ),
            Ok(json!(true))
        );
        let s = call(&m, "nvmf_get_subsystems", json!({"nqn": NQN})).unwrap();
        assert_eq!(
            s[0]["hosts"][0],
            json!({"nqn": HOST, "dhchap_key": "key0", "dhchap_ctrlr_key": "key0"})
        );
        assert_eq!(
            call(&m, "keyring_file_remove_key", json!({"name": "key0"})),
            Ok(json!(true))
        );
        let e = call(&m, "keyring_file_remove_key", json!({"name": "key0"})).unwrap_err();
        assert_eq!(e.code, -libc::ENOENT);
    }
}
