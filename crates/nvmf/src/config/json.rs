//! Reading SPDK's JSON configuration into a [`TargetConfig`] (what is read:
//! the docs of [`crate::config`]).
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use pollux_bdev::config::{Config as BdevConfig, Entry, NvmeAttach};
use pollux_bdev::params::Params;
use pollux_bdev::Bdev;
use pollux_controller::NsIds;
use pollux_spec::fabrics::DISCOVERY_NQN;
use pollux_spec::log::AnaState;
use serde_json::{json, Map, Value};

use super::auth::{
    names_to_mask, HostKeys, KeyFile, DHGROUPS, DIGESTS, MAX_DH_QUEUE, MAX_DH_THREADS,
};
use super::error::ConfigError;
use super::target::{
    check_cntlid_range, parse_hex_id, parse_uuid, NamespaceConfig, SubsystemConfig, TargetConfig,
    CNTLID_MAX,
};
use super::transport::{
    SockImpl, TransportOptions, MAX_CONNECTIONS, MAX_H2C_DATA, MAX_HANDSHAKE_TIMEOUT,
    MAX_RX_BUFFER, MAX_SEND_IOV, REGISTERED_BUFFERS, SEND_BUFFERS,
};

/// The parameters `nvmf_create_transport` takes (SPDK's and pollux's own;
/// [`TransportOptions::create_transport_params`] writes them back).
const TRANSPORT_PARAMS: &[&str] = &[
    "trtype",
    "tgt_name",
    "max_queue_depth",
    "max_io_qpairs_per_ctrlr",
    "max_qpairs_per_ctrlr",
    "in_capsule_data_size",
    "max_io_size",
    "io_unit_size",
    "max_aq_depth",
    "num_shared_buffers",
    "buf_cache_size",
    "dif_insert_or_strip",
    "c2h_success",
    "sock_priority",
    "abort_timeout_sec",
    "zcopy",
    "ack_timeout",
    "data_wr_pool_size",
    "control_msg_num",
    "disable_command_passthru",
    "kas",
    "icreq_timeout_ms",
    "connect_timeout_ms",
    "auth_timeout_ms",
    "send_iov",
    "max_unbound_connections",
    "data_timeout_ms",
    "busy_poll_us",
    "sock_impl",
    "uring_fixed_files",
    "uring_rx_buffers",
    "uring_rx_buffer_size",
    "uring_zcopy_threshold",
    "uring_registered_buffers",
    "admin_in_capsule_data_size",
    "max_h2c_data",
    "max_connections",
    "rx_buffer_size",
    "incoming_cpu",
    "epoll_idle",
    "direct_receive",
    "epoll_receive",
    "send_buffer",
];

impl TargetConfig {
    /// Reads SPDK's JSON configuration (see the module docs) and creates
    /// its bdevs; `bdev_nvme_attach_controller` is refused (see
    /// [`TargetConfig::from_json_with`]).
    pub fn from_json(json: &str) -> Result<TargetConfig, ConfigError> {
        TargetConfig::from_json_with(json, &mut |a: &NvmeAttach| {
            Err::<Vec<Bdev>, String>(format!(
                "controller '{}': this configuration is read without an NVMe transport (TargetConfig::from_json_with opens NVMe controllers)",
                a.name
            ))
        })
    }
}
impl TargetConfig {
    /// Reads SPDK's JSON configuration (see the module docs) and creates
    /// its bdevs; `attach` opens the controller of each
    /// `bdev_nvme_attach_controller` and returns its namespaces' bdevs
    /// (named `<name>n<nsid>`).
    pub fn from_json_with<E>(
        json: &str,
        attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, E>,
    ) -> Result<TargetConfig, ConfigError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (cfg, _) = TargetConfig::read_json(json, |bc| Ok(bc.create(attach)?))?;
        // (Not yet the listeners' sock_impl: the caller may set the
        // transport's; `Target::start` checks it.)
        cfg.validate_read()?;
        Ok(cfg)
    }

    /// Reads SPDK's JSON configuration as [`TargetConfig::from_json_with`]
    /// does, checking it as completely, but creates no bdev (`bdevs` stays
    /// empty): what a reload reads before it changes anything. A
    /// namespace's bdev must be one the bdev subsystem's entries name (an
    /// NVMe controller's: `<name>n<nsid>`). Also returns those entries.
    pub fn from_json_unmade(json: &str) -> Result<(TargetConfig, Vec<Entry>), ConfigError> {
        let (cfg, entries) = TargetConfig::read_json(json, |_| Ok(Vec::new()))?;
        let named = |bdev: &str| {
            entries.iter().any(|e| match e {
                Entry::NvmeAttach(a) => bdev
                    .strip_prefix(a.name.as_str())
                    .and_then(|r| r.strip_prefix('n'))
                    .is_some_and(|n| n.parse::<u32>().is_ok_and(|id| id > 0)),
                e => e.name() == bdev,
            })
        };
        cfg.validate_with(&named)?;
        Ok((cfg, entries))
    }

    /// Reads the document into a configuration (not validated), its
    /// bdevs made by `make` of the bdev subsystem's entries; also returns
    /// those entries.
    fn read_json(
        json: &str,
        make: impl FnOnce(&BdevConfig) -> Result<Vec<Bdev>, ConfigError>,
    ) -> Result<(TargetConfig, Vec<Entry>), ConfigError> {
        let doc: Value = serde_json::from_str(json)?;
        let subsystems = pollux_bdev::config::subsystems(&doc)?;
        let mut cfg = TargetConfig::default();
        let mut bdev_doc = None;
        let mut nvmf: &[Value] = &[];
        let mut keyring: &[Value] = &[];
        for s in subsystems {
            match s.get("subsystem").and_then(Value::as_str) {
                Some("bdev") => bdev_doc = Some(s.clone()),
                Some("nvmf") => {
                    nvmf = s
                        .get("config")
                        .and_then(Value::as_array)
                        .map(Vec::as_slice)
                        .unwrap_or(&[])
                }
                Some("keyring") => {
                    keyring = s
                        .get("config")
                        .and_then(Value::as_array)
                        .map(Vec::as_slice)
                        .unwrap_or(&[])
                }
                Some(other) => cfg.warn(format!("subsystem '{other}' ignored")),
                None => {
                    return Err(ConfigError::Shape(
                        "a subsystem entry has no \"subsystem\" name".into(),
                    ))
                }
            }
        }
        let mut entries = Vec::new();
        if let Some(b) = bdev_doc {
            let only = serde_json::json!({ "subsystems": [b] }).to_string();
            let bc = BdevConfig::parse(&only)?;
            cfg.warnings.extend(bc.warnings.iter().cloned());
            cfg.bdevs = make(&bc)?;
            entries = bc.entries;
        }
        // The keys first, wherever the file has them: hosts name them.
        for e in keyring {
            cfg.apply(e)?;
        }
        for e in nvmf {
            cfg.apply(e)?;
        }
        Ok((cfg, entries))
    }

    /// Reads one entry of the `nvmf` subsystem (`{"method", "params"}`)
    /// into this configuration, as the file's entries are read: the
    /// JSON-RPC method of the same name decodes its parameters with it
    /// (same rules, same messages).
    pub fn apply_entry(&mut self, entry: &Value) -> Result<(), ConfigError> {
        self.apply(entry)
    }

    fn warn(&mut self, w: String) {
        tracing::warn!("{w}");
        self.warnings.push(w);
    }

    fn apply(&mut self, e: &Value) -> Result<(), ConfigError> {
        let method = e
            .get("method")
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigError::Shape("an nvmf entry has no \"method\" string".into()))?
            .to_string();
        let empty = Map::new();
        let params = match e.get("params") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(ConfigError::Shape(format!(
                    "{method}: \"params\" is not an object"
                )))
            }
        };
        let p = Params::new(&method, params);
        match method.as_str() {
            "nvmf_create_transport" => {
                p.known(TRANSPORT_PARAMS)?;
                let trtype = p.str_req("trtype")?;
                if !trtype.eq_ignore_ascii_case("tcp") {
                    return Err(p
                        .bad("trtype", format!("'{trtype}': only TCP is supported"))
                        .into());
                }
                let t = &mut self.transport;
                if let Some(v) = p.uint("max_queue_depth", 2, 4096)? {
                    t.max_queue_depth = v as u16;
                }
                if let Some(v) = p.uint("max_io_qpairs_per_ctrlr", 1, 65535)? {
                    t.max_io_qpairs_per_ctrlr = v as u16;
                }
                if let Some(v) = p.uint("max_qpairs_per_ctrlr", 2, 65535)? {
                    t.max_io_qpairs_per_ctrlr = (v - 1) as u16;
                }
                if let Some(v) = p.uint("in_capsule_data_size", 0, 1 << 20)? {
                    t.in_capsule_data_size = v as u32;
                }
                if let Some(v) = p.uint("max_io_size", 4096, 16 << 20)? {
                    t.max_io_size = v as u32;
                }
                if let Some(v) = p.uint("max_aq_depth", 2, 4096)? {
                    t.max_aq_depth = v as u16;
                }
                if let Some(v) = p.uint("kas", 0, 65535)? {
                    t.kas = v as u16;
                }
                let max_ms = MAX_HANDSHAKE_TIMEOUT.as_millis() as u64;
                if let Some(v) = p.uint("icreq_timeout_ms", 1, max_ms)? {
                    t.icreq_timeout = Duration::from_millis(v);
                }
                if let Some(v) = p.uint("connect_timeout_ms", 1, max_ms)? {
                    t.connect_timeout = Duration::from_millis(v);
                }
                if let Some(v) = p.uint("auth_timeout_ms", 1, max_ms)? {
                    t.auth_timeout = Duration::from_millis(v);
                }
                if let Some(v) = p.uint("send_iov", 1, MAX_SEND_IOV as u64)? {
                    t.send_iov = v as usize;
                }
                let conns = MAX_CONNECTIONS as u64;
                if let Some(v) = p.uint("max_unbound_connections", 1, conns)? {
                    t.max_unbound_connections = v as usize;
                }
                if let Some(v) = p.uint("max_connections", 1, conns)? {
                    t.max_connections = v as usize;
                }
                if let Some(v) = p.uint("admin_in_capsule_data_size", 8192, 1 << 20)? {
                    t.admin_in_capsule_data_size = v as u32;
                }
                if let Some(v) = p.uint("max_h2c_data", 4096, MAX_H2C_DATA as u64)? {
                    if !v.is_multiple_of(4) {
                        return Err(p
                            .bad("max_h2c_data", format!("{v}: must be a multiple of 4"))
                            .into());
                    }
                    t.max_h2c_data = v as u32;
                }
                if let Some(v) = p.uint("rx_buffer_size", 4096, MAX_RX_BUFFER as u64)? {
                    t.rx_buffer = v as usize;
                }
                if let Some(v) = p.bool_opt("incoming_cpu")? {
                    t.incoming_cpu = v;
                }
                if let Some(v) = p.bool_opt("epoll_idle")? {
                    t.epoll_idle = v;
                }
                if let Some(v) = p.bool_opt("direct_receive")? {
                    t.direct_receive = v;
                }
                if let Some(v) = p.bool_opt("epoll_receive")? {
                    t.epoll_receive = v;
                }
                if let Some(v) = p.uint("send_buffer", 0, u64::from(*SEND_BUFFERS.end()))? {
                    t.send_buffer = v as u32;
                }
                if let Some(v) = p.uint("num_shared_buffers", 1, u32::MAX as u64)? {
                    t.num_shared_buffers = v as u32;
                }
                if let Some(v) = p.uint("io_unit_size", 4096, 16 << 20)? {
                    t.io_unit_size = v as u32;
                }
                // SPDK writes UINT32_MAX for "pick one".
                match p.uint("buf_cache_size", 0, u32::MAX as u64)? {
                    Some(v) if v == u32::MAX as u64 => t.buf_cache_size = None,
                    Some(v) => t.buf_cache_size = Some(v as u32),
                    None => {}
                }
                if let Some(v) = p.uint("data_timeout_ms", 1, max_ms)? {
                    t.data_timeout = Duration::from_millis(v);
                }
                if let Some(v) = p.uint("busy_poll_us", 0, 1_000_000)? {
                    t.busy_poll_us = v as u32;
                }
                if let Some(v) = p.str_opt("sock_impl")? {
                    t.sock_impl = SockImpl::from_name(v)
                        .ok_or_else(|| p.bad("sock_impl", format!("'{v}': posix or uring")))?;
                }
                if let Some(v) = p.bool_opt("uring_fixed_files")? {
                    t.uring_fixed_files = v;
                }
                if let Some(v) = p.uint("uring_rx_buffers", 1, 1 << 15)? {
                    t.uring_rx_buffers = v as u16;
                }
                if let Some(v) = p.uint("uring_rx_buffer_size", 512, 1 << 20)? {
                    t.uring_rx_buffer_size = v as u32;
                }
                if let Some(v) = p.uint("uring_zcopy_threshold", 0, 1 << 30)? {
                    t.uring_zcopy_threshold = v as u32;
                }
                // (Below 1 MiB, or without uring_zcopy_threshold:
                // `validate` refuses it, by name.)
                let most = u64::from(*REGISTERED_BUFFERS.end());
                if let Some(v) = p.uint("uring_registered_buffers", 0, most)? {
                    t.uring_registered_buffers = v as u32;
                }
                p.bool_opt("zcopy")?;
                // (SPDK's client sends c2h_success true and zcopy false
                // every time: at those values there is nothing to ignore.)
                for ignored in [
                    "sock_priority",
                    "abort_timeout_sec",
                    "ack_timeout",
                    "data_wr_pool_size",
                    "control_msg_num",
                    "c2h_success",
                    "zcopy",
                ] {
                    let default = match ignored {
                        "c2h_success" => Some(Value::Bool(true)),
                        "zcopy" => Some(Value::Bool(false)),
                        _ => None,
                    };
                    if params.contains_key(ignored) && params.get(ignored) != default.as_ref() {
                        self.warn(format!("{method}: parameter '{ignored}' ignored"));
                    }
                }
                if p.bool_opt("dif_insert_or_strip")? == Some(true) {
                    return Err(p
                        .bad(
                            "dif_insert_or_strip",
                            "protection information is not supported",
                        )
                        .into());
                }
                self.transport.validate()?;
                self.transport_created = true;
            }
            "nvmf_create_subsystem" => {
                p.known(&[
                    "nqn",
                    "serial_number",
                    "model_number",
                    "allow_any_host",
                    "max_namespaces",
                    "tgt_name",
                    "ana_reporting",
                    "min_cntlid",
                    "max_cntlid",
                ])?;
                let nqn = p.str_req("nqn")?;
                let mut s = SubsystemConfig::new(nqn);
                s.serial = p.str_opt("serial_number")?.map(str::to_string);
                s.model = p.str_opt("model_number")?.map(str::to_string);
                s.allow_any_host = p.bool_opt("allow_any_host")?.unwrap_or(false);
                s.max_namespaces = p.uint("max_namespaces", 0, 1024)?.unwrap_or(0) as u32;
                s.ana_reporting = p.bool_opt("ana_reporting")?.unwrap_or(false);
                if let Some(v) = p.uint("min_cntlid", 1, CNTLID_MAX as u64)? {
                    s.min_cntlid = v as u16;
                }
                if let Some(v) = p.uint("max_cntlid", 1, CNTLID_MAX as u64)? {
                    s.max_cntlid = v as u16;
                }
                check_cntlid_range(s.min_cntlid, s.max_cntlid)
                    .map_err(|why| p.bad("min_cntlid", why))?;
                if self.subsystems.iter().any(|o| o.nqn == nqn) {
                    return Err(p.bad("nqn", format!("'{nqn}' is created twice")).into());
                }
                self.subsystems.push(s);
            }
            "nvmf_subsystem_add_ns" => {
                p.known(&["nqn", "namespace", "tgt_name"])?;
                let q = p.object("namespace")?;
                q.known(&[
                    "bdev_name",
                    "nsid",
                    "uuid",
                    "nguid",
                    "eui64",
                    "ptpl_file",
                    "anagrpid",
                    "no_auto_visible",
                ])?;
                let bdev = q.str_req("bdev_name")?.to_string();
                let nsid = q.uint("nsid", 1, 1024)?.map(|v| v as u32);
                let mut ids = NsIds::default();
                if let Some(u) = q.str_opt("uuid")? {
                    ids.uuid = Some(parse_uuid(u).ok_or_else(|| {
                        q.bad(
                            "uuid",
                            format!("'{u}' is not a UUID (8-4-4-4-12 hex digits)"),
                        )
                    })?);
                }
                if let Some(u) = q.str_opt("nguid")? {
                    ids.nguid =
                        Some(parse_hex_id(u).ok_or_else(|| {
                            q.bad("nguid", format!("'{u}' is not 32 hex digits"))
                        })?);
                }
                if let Some(u) = q.str_opt("eui64")? {
                    ids.eui64 =
                        Some(parse_hex_id(u).ok_or_else(|| {
                            q.bad("eui64", format!("'{u}' is not 16 hex digits"))
                        })?);
                }
                let anagrpid = q.uint("anagrpid", 1, 1024)?.unwrap_or(0) as u32;
                let s = self.subsystem_mut(&p)?;
                s.namespaces.push(NamespaceConfig {
                    bdev,
                    nsid,
                    ids,
                    anagrpid,
                });
            }
            "nvmf_subsystem_add_listener" => {
                p.known(&[
                    "nqn",
                    "listen_address",
                    "tgt_name",
                    "secure_channel",
                    "ana_state",
                    "sock_impl",
                ])?;
                let addr = listen_address(&p)?;
                // SPDK writes it when the listener has one: kept, checked
                // against the transport's by `validate`.
                let sock_impl = match p.str_opt("sock_impl")? {
                    Some(v) => Some(
                        SockImpl::from_name(v)
                            .ok_or_else(|| p.bad("sock_impl", format!("'{v}': posix or uring")))?,
                    ),
                    None => None,
                };
                let ana = match p.str_opt("ana_state")? {
                    Some(v) => Some(ana_state(&p, v)?),
                    None => None,
                };
                let nqn = p.str_req("nqn")?;
                let nqn = if nqn == "discovery" {
                    DISCOVERY_NQN
                } else {
                    nqn
                };
                if let Some(s) = sock_impl {
                    self.listener_sock_impls.push((nqn.to_string(), addr, s));
                }
                if nqn == DISCOVERY_NQN {
                    // The discovery subsystem listens wherever any does,
                    // and here too (SPDK's discovery port, e.g. 8009).
                    if !self.discovery_listeners.contains(&addr) {
                        self.discovery_listeners.push(addr);
                    }
                    return Ok(());
                }
                let s = self.subsystem_mut(&p)?;
                if !s.listeners.contains(&addr) {
                    s.listeners.push(addr);
                }
                if let Some(st) = ana {
                    s.ana_states.push((addr, None, st));
                }
            }
            "nvmf_subsystem_listener_set_ana_state" => {
                p.known(&["nqn", "listen_address", "ana_state", "anagrpid", "tgt_name"])?;
                let addr = listen_address(&p)?;
                let v = p.str_req("ana_state")?;
                let st = ana_state(&p, v)?;
                let g = p.uint("anagrpid", 1, 1024)?.map(|g| g as u32);
                let s = self.subsystem_mut(&p)?;
                if !s.ana_reporting {
                    return Err(p
                        .bad(
                            "nqn",
                            "ANA reporting is off (nvmf_create_subsystem ana_reporting true)",
                        )
                        .into());
                }
                if !s.listeners.contains(&addr) {
                    return Err(p
                        .bad(
                            "listen_address",
                            format!("{addr} is not a listener of the subsystem (nvmf_subsystem_add_listener first)"),
                        )
                        .into());
                }
                s.ana_states.push((addr, g, st));
            }
            "nvmf_subsystem_add_host" => {
                p.known(&[
                    "nqn",
                    "host",
                    "tgt_name",
                    "psk",
                    "dhchap_key",
                    "dhchap_ctrlr_key",
                ])?;
                if params.contains_key("psk") {
                    return Err(p.bad("psk", "TLS is not supported").into());
                }
                let host = p.str_req("host")?;
                let keys = self.host_keys(&p, host)?;
                let s = self.subsystem_mut(&p)?;
                if !s.hosts.iter().any(|h| h == host) {
                    s.hosts.push(host.to_string());
                }
                s.host_keys.retain(|k| k.host != host);
                s.host_keys.extend(keys);
            }
            "keyring_file_add_key" => {
                p.known(&["name", "path"])?;
                let name = p.str_req("name")?;
                let path = p.str_req("path")?;
                let key = KeyFile::load(name, std::path::Path::new(path))?;
                self.keyring.add(key)?;
            }
            "nvmf_set_config" => {
                p.known(&[
                    "discovery_filter",
                    "poll_groups_mask",
                    "admin_cmd_passthru",
                    "dhchap_digests",
                    "dhchap_dhgroups",
                    "dhchap_dh_threads",
                    "dhchap_dh_queue_per_host",
                    "dhchap_dh_queue_max",
                ])?;
                if let Some(m) = name_list(&p, "dhchap_digests", &DIGESTS)? {
                    self.auth.digests = m;
                }
                if let Some(m) = name_list(&p, "dhchap_dhgroups", &DHGROUPS)? {
                    self.auth.dhgroups = m;
                }
                if let Some(v) = p.uint("dhchap_dh_threads", 1, MAX_DH_THREADS as u64)? {
                    self.auth.dh_threads = v as u32;
                }
                if let Some(v) = p.uint("dhchap_dh_queue_per_host", 1, MAX_DH_QUEUE as u64)? {
                    self.auth.dh_queue_per_host = v as u32;
                }
                if let Some(v) = p.uint("dhchap_dh_queue_max", 1, MAX_DH_QUEUE as u64)? {
                    self.auth.dh_queue_max = v as u32;
                }
                for k in ["discovery_filter", "poll_groups_mask", "admin_cmd_passthru"] {
                    if params.contains_key(k) {
                        self.warn(format!("{method}: parameter '{k}' ignored"));
                    }
                }
            }
            "nvmf_set_max_subsystems" | "nvmf_set_crdt" => {
                self.warn(format!("{method} ignored"));
            }
            _ => return Err(ConfigError::UnknownMethod { method }),
        }
        Ok(())
    }

    /// The DH-HMAC-CHAP keys of `nvmf_subsystem_add_host`'s `params`
    /// for `host`, checked against the keyring (none: no entry).
    pub(crate) fn host_keys(
        &self,
        p: &Params<'_>,
        host: &str,
    ) -> Result<Option<HostKeys>, ConfigError> {
        let key = p.str_opt("dhchap_key")?;
        let ctrlr_key = p.str_opt("dhchap_ctrlr_key")?;
        for (param, name) in [("dhchap_key", key), ("dhchap_ctrlr_key", ctrlr_key)] {
            if let Some(n) = name {
                if self.keyring.get(n).is_none() {
                    return Err(p
                        .bad(
                            param,
                            format!("no key '{n}' in the keyring (keyring_file_add_key first)"),
                        )
                        .into());
                }
            }
        }
        match (key, ctrlr_key) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(p
                .bad(
                    "dhchap_ctrlr_key",
                    "a controller key needs a host key (dhchap_key)",
                )
                .into()),
            (Some(k), c) => Ok(Some(HostKeys {
                host: host.to_string(),
                key: k.to_string(),
                ctrlr_key: c.map(str::to_string),
            })),
        }
    }

    fn subsystem_mut(&mut self, p: &Params<'_>) -> Result<&mut SubsystemConfig, ConfigError> {
        let nqn = p.str_req("nqn")?;
        Ok(self
            .subsystems
            .iter_mut()
            .find(|s| s.nqn == nqn)
            .ok_or_else(|| {
                p.bad(
                    "nqn",
                    format!("no subsystem '{nqn}' (nvmf_create_subsystem first)"),
                )
            })?)
    }
}

impl TransportOptions {
    /// `nvmf_create_transport`'s `params` for these options, as
    /// `save_config` writes them: what the reader above reads back to the
    /// same options.
    pub(crate) fn create_transport_params(&self) -> Value {
        let o = self;
        let mut p = json!({
            "trtype": "TCP",
            "max_queue_depth": o.max_queue_depth,
            "max_io_qpairs_per_ctrlr": o.max_io_qpairs_per_ctrlr,
            "in_capsule_data_size": o.in_capsule_data_size,
            "max_io_size": o.max_io_size,
            "io_unit_size": o.io_unit_size,
            "max_aq_depth": o.max_aq_depth,
            "num_shared_buffers": o.num_shared_buffers,
            "dif_insert_or_strip": false,
        });
        if let Some(c) = o.buf_cache_size {
            p["buf_cache_size"] = c.into();
        }
        // SPDK's `kas` and pollux's own (SPDK's reader ignores parameters
        // it does not know: it decodes nvmf_create_transport relaxed),
        // written only when not the default, so a default target's entry
        // has SPDK's keys alone (and `sock_impl` left out keeps the
        // threads' own when the entry is sent to a running target).
        let d = TransportOptions::default();
        let ms = |t: Duration| Value::from(t.as_millis() as u64);
        let extra: [(&str, Value, Value); 23] = [
            ("kas", o.kas.into(), d.kas.into()),
            ("icreq_timeout_ms", ms(o.icreq_timeout), ms(d.icreq_timeout)),
            (
                "connect_timeout_ms",
                ms(o.connect_timeout),
                ms(d.connect_timeout),
            ),
            ("auth_timeout_ms", ms(o.auth_timeout), ms(d.auth_timeout)),
            ("send_iov", o.send_iov.into(), d.send_iov.into()),
            (
                "max_unbound_connections",
                o.max_unbound_connections.into(),
                d.max_unbound_connections.into(),
            ),
            ("data_timeout_ms", ms(o.data_timeout), ms(d.data_timeout)),
            ("busy_poll_us", o.busy_poll_us.into(), d.busy_poll_us.into()),
            // SPDK's name and values (a listener's `sock_impl` there).
            (
                "sock_impl",
                o.sock_impl.name().into(),
                d.sock_impl.name().into(),
            ),
            (
                "uring_fixed_files",
                o.uring_fixed_files.into(),
                d.uring_fixed_files.into(),
            ),
            (
                "uring_rx_buffers",
                o.uring_rx_buffers.into(),
                d.uring_rx_buffers.into(),
            ),
            (
                "uring_rx_buffer_size",
                o.uring_rx_buffer_size.into(),
                d.uring_rx_buffer_size.into(),
            ),
            (
                "uring_zcopy_threshold",
                o.uring_zcopy_threshold.into(),
                d.uring_zcopy_threshold.into(),
            ),
            (
                "uring_registered_buffers",
                o.uring_registered_buffers.into(),
                d.uring_registered_buffers.into(),
            ),
            (
                "admin_in_capsule_data_size",
                o.admin_in_capsule_data_size.into(),
                d.admin_in_capsule_data_size.into(),
            ),
            ("max_h2c_data", o.max_h2c_data.into(), d.max_h2c_data.into()),
            (
                "max_connections",
                o.max_connections.into(),
                d.max_connections.into(),
            ),
            ("rx_buffer_size", o.rx_buffer.into(), d.rx_buffer.into()),
            ("incoming_cpu", o.incoming_cpu.into(), d.incoming_cpu.into()),
            ("epoll_idle", o.epoll_idle.into(), d.epoll_idle.into()),
            (
                "direct_receive",
                o.direct_receive.into(),
                d.direct_receive.into(),
            ),
            (
                "epoll_receive",
                o.epoll_receive.into(),
                d.epoll_receive.into(),
            ),
            ("send_buffer", o.send_buffer.into(), d.send_buffer.into()),
        ];
        for (k, v, def) in extra {
            if v != def {
                p[k] = v;
            }
        }
        p
    }
}

/// A list of names (`param`, an array of strings) of table `t` as a mask.
fn name_list(p: &Params<'_>, param: &str, t: &[(&str, u8)]) -> Result<Option<u8>, ConfigError> {
    let Some(v) = p.get(param) else {
        return Ok(None);
    };
    let names: Option<Vec<&str>> = v
        .as_array()
        .map(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .unwrap_or(None);
    let Some(names) = names else {
        return Err(p
            .bad(param, format!("expected an array of strings, got {v}"))
            .into());
    };
    names_to_mask(t, names)
        .map(Some)
        .map_err(|why| p.bad(param, why).into())
}

/// SPDK's `listen_address` object of `p` (TCP, an IP address, a port:
/// 4420 if none).
fn listen_address(p: &Params<'_>) -> Result<SocketAddr, ConfigError> {
    let q = p.object("listen_address")?;
    q.known(&["trtype", "adrfam", "traddr", "trsvcid"])?;
    let trtype = q.str_req("trtype")?;
    if !trtype.eq_ignore_ascii_case("tcp") {
        return Err(q
            .bad("trtype", format!("'{trtype}': only TCP is supported"))
            .into());
    }
    let traddr = q.str_req("traddr")?;
    let ip: IpAddr = traddr
        .parse()
        .map_err(|_| q.bad("traddr", format!("'{traddr}' is not an IP address")))?;
    let port = match q.get("trsvcid") {
        None => 4420,
        Some(Value::String(s)) => s
            .parse::<u16>()
            .map_err(|_| q.bad("trsvcid", format!("'{s}' is not a port number")))?,
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|v| u16::try_from(v).ok())
            .ok_or_else(|| q.bad("trsvcid", format!("{n} is not a port number")))?,
        Some(v) => {
            return Err(q
                .bad(
                    "trsvcid",
                    format!("expected a port number (a string or an integer), got {v}"),
                )
                .into())
        }
    };
    if let Some(f) = q.str_opt("adrfam")? {
        let ok = (f.eq_ignore_ascii_case("ipv4") && ip.is_ipv4())
            || (f.eq_ignore_ascii_case("ipv6") && ip.is_ipv6());
        if !ok {
            return Err(q
                .bad("adrfam", format!("'{f}' does not match '{traddr}'"))
                .into());
        }
    }
    Ok(SocketAddr::new(ip, port))
}

/// An ANA state by SPDK's name (`optimized`, `non_optimized`,
/// `inaccessible`), `v` of `p`'s `ana_state`.
fn ana_state(p: &Params<'_>, v: &str) -> Result<AnaState, ConfigError> {
    match AnaState::from_name(v) {
        Some(st @ (AnaState::Optimized | AnaState::NonOptimized | AnaState::Inaccessible)) => {
            Ok(st)
        }
        _ => Err(p
            .bad(
                "ana_state",
                format!("'{v}': optimized, non_optimized or inaccessible"),
            )
            .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of `nvmf_create_transport` that set no transport option:
    /// the transport's type and target, SPDK's tuning the reader ignores,
    /// and SPDK's DIF flag (only `false` passes).
    const NOT_OPTIONS: &[&str] = &[
        "trtype",
        "tgt_name",
        "dif_insert_or_strip",
        "c2h_success",
        "sock_priority",
        "abort_timeout_sec",
        "zcopy",
        "ack_timeout",
        "data_wr_pool_size",
        "control_msg_num",
        "disable_command_passthru",
    ];

    /// The transport options `nvmf_create_transport` with `params` reads.
    fn read(params: Value) -> Result<TransportOptions, ConfigError> {
        let mut c = TargetConfig::default();
        c.apply_entry(&json!({"method": "nvmf_create_transport", "params": params}))?;
        Ok(c.transport)
    }

    /// The params key `k` is tried with: those of a transport that
    /// takes it (`uring_registered_buffers` only with
    /// `uring_zcopy_threshold`).
    fn base(k: &str) -> Value {
        match k {
            "uring_registered_buffers" => json!({"trtype": "TCP", "uring_zcopy_threshold": 4096}),
            _ => json!({"trtype": "TCP"}),
        }
    }

    /// Every key the reader takes either sets an option, and then what
    /// `save_config` writes for the options it set reads back to the same
    /// options (the whole `TransportOptions`), or it is one of
    /// [`NOT_OPTIONS`]. A key added to the reader and forgotten by the
    /// writer fails here (before: `sock_impl` and the `uring_*` keys).
    #[test]
    fn every_transport_option_the_reader_takes_is_saved_back() {
        // Values tried for each key, in order; the first that the reader
        // takes and that changes the options is used.
        let tried = [
            json!(false),
            json!(true),
            json!("uring"),
            json!("posix"),
            json!(2),
            json!(16),
            json!(512),
            json!(4096),
            json!(65536),
            json!(1 << 20),
        ];
        let mut options = 0;
        for &k in TRANSPORT_PARAMS {
            // (The options of the base alone, which the key must change.)
            let d = read(base(k)).unwrap();
            let set = tried.iter().find_map(|v| {
                let mut p = base(k);
                p[k] = v.clone();
                read(p).ok().filter(|o| *o != d)
            });
            match set {
                None => assert!(
                    NOT_OPTIONS.contains(&k),
                    "'{k}': none of {tried:?} changes the transport options (an option with other bounds: add a value; not an option: add it to NOT_OPTIONS)"
                ),
                Some(o) => {
                    assert!(
                        !NOT_OPTIONS.contains(&k),
                        "'{k}' sets a transport option: take it out of NOT_OPTIONS"
                    );
                    let saved = o.create_transport_params();
                    assert_eq!(
                        read(saved.clone()).unwrap(),
                        o,
                        "'{k}': saved as {saved} reads back to other options"
                    );
                    options += 1;
                }
            }
        }
        assert_eq!(options, TRANSPORT_PARAMS.len() - NOT_OPTIONS.len());
    }

    /// A document of a transport with `transport` params and a listener
    /// of subsystem `nqn` (created unless the discovery one) with
    /// `listener` params added.
    fn listener_doc(transport: Value, nqn: &str, listener: Value) -> String {
        let mut add = json!({"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}});
        for (k, v) in listener.as_object().unwrap() {
            add[k] = v.clone();
        }
        let mut nvmf = vec![json!({"method": "nvmf_create_transport", "params": transport})];
        if nqn != "discovery" {
            nvmf.push(json!({"method": "nvmf_create_subsystem", "params": {"nqn": nqn}}));
        }
        nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": add}));
        json!({"subsystems": [{"subsystem": "nvmf", "config": nvmf}]}).to_string()
    }

    /// SPDK's per-listener `sock_impl` (its `save_config` writes it when
    /// set) is taken when it names the transport's socket implementation
    /// and refused by `validate` (what `Target::start` and `pollux target`
    /// check, after its `--sock-impl`) naming the key and both
    /// implementations when it names another (before: refused as an
    /// unknown parameter whatever it named); a name that is neither is
    /// refused by the reader.
    #[test]
    fn a_listeners_sock_impl_must_be_the_transports() {
        const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
        let tcp = json!({"trtype": "TCP"});
        let uring = json!({"trtype": "TCP", "sock_impl": "uring"});
        for (transport, nqn, si) in [
            (&tcp, NQN, "posix"),
            (&uring, NQN, "uring"),
            (&uring, "discovery", "uring"),
        ] {
            let doc = listener_doc(transport.clone(), nqn, json!({"sock_impl": si}));
            let c = TargetConfig::from_json(&doc).unwrap_or_else(|e| panic!("{si}: {e}"));
            c.validate().unwrap_or_else(|e| panic!("{si}: {e}"));
        }
        for (transport, nqn, si, other) in [
            (&tcp, NQN, "uring", "posix"),
            (&uring, NQN, "posix", "uring"),
            (&tcp, "discovery", "uring", "posix"),
        ] {
            let doc = listener_doc(transport.clone(), nqn, json!({"sock_impl": si}));
            let mut c = TargetConfig::from_json(&doc).expect("read: the caller may set sock_impl");
            let e = c.validate().expect_err(si).to_string();
            assert!(
                e.contains("parameter 'sock_impl' is '")
                    && e.contains(&format!("'{si}'"))
                    && e.contains(&format!("the transport's sock_impl is '{other}'"))
                    && e.contains("127.0.0.1:4420"),
                "{e}"
            );
            // Set to the listener's (`--sock-impl`): taken.
            c.transport.sock_impl = SockImpl::from_name(si).unwrap();
            c.validate().unwrap();
        }
        let doc = listener_doc(tcp, NQN, json!({"sock_impl": "epoll"}));
        let e = TargetConfig::from_json(&doc)
            .expect_err("epoll")
            .to_string();
        assert!(
            e.contains(
                "nvmf_subsystem_add_listener: parameter 'sock_impl': 'epoll': posix or uring"
            ),
            "{e}"
        );
    }

    /// The options that only `pollux target`'s flags could set before
    /// (and those nothing but the library could) are read from their
    /// keys, and a bad value is refused naming the key.
    #[test]
    fn the_flag_only_transport_options_have_keys() {
        let o = read(
            json!({"trtype": "TCP", "incoming_cpu": true, "epoll_idle": false,
            "direct_receive": false, "admin_in_capsule_data_size": 16384,
            "max_h2c_data": 65536, "max_connections": 100, "rx_buffer_size": 32768}),
        )
        .unwrap();
        let d = TransportOptions::default();
        assert_eq!(
            (o.incoming_cpu, o.epoll_idle, o.direct_receive),
            (!d.incoming_cpu, !d.epoll_idle, !d.direct_receive)
        );
        assert_eq!(
            (
                o.admin_in_capsule_data_size,
                o.max_h2c_data,
                o.max_connections,
                o.rx_buffer
            ),
            (16384, 65536, 100, 32768)
        );
        for (k, v, why) in [
            ("incoming_cpu", json!(1), "expected true or false, got 1"),
            ("epoll_idle", json!("no"), "expected true or false"),
            ("direct_receive", json!(0), "expected true or false"),
            ("admin_in_capsule_data_size", json!(4096), "8192..=1048576"),
            ("max_h2c_data", json!(1024), "4096..=16777216"),
            ("max_h2c_data", json!(4098), "4098: must be a multiple of 4"),
            ("max_connections", json!(0), "1..=1048576"),
            ("rx_buffer_size", json!(100), "4096..=16777216"),
            ("rx_buffer_size", json!(1 << 30), "4096..=16777216"),
        ] {
            let mut p = json!({"trtype": "TCP"});
            p[k] = v.clone();
            let e = read(p).expect_err(k).to_string();
            assert!(
                e.contains(&format!("nvmf_create_transport: parameter '{k}'")) && e.contains(why),
                "{k} {v}: {e}"
            );
        }
    }
}
