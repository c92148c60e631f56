//! The target's configuration: transport options, subsystems (NQN,
//! serial, model, namespaces on bdevs, listeners, host allow list), and
//! reading it from SPDK's JSON configuration shape:
//!
//! ```json
//! {"subsystems": [
//!   {"subsystem": "bdev", "config": [
//!     {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 32768, "block_size": 512}}]},
//!   {"subsystem": "nvmf", "config": [
//!     {"method": "nvmf_create_transport", "params": {"trtype": "TCP", "in_capsule_data_size": 4096}},
//!     {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "serial_number": "SPDK001", "allow_any_host": false}},
//!     {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
//!     {"method": "nvmf_subsystem_add_host", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "host": "nqn.2014-08.org.nvmexpress:uuid:1"}},
//!     {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
//!       "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}}}]}
//! ]}
//! ```
//!
//! The `bdev` subsystem is read by `pollux_bdev::config` (its methods and
//! rules); its `bdev_nvme_attach_controller` entries are opened by the
//! caller's function ([`TargetConfig::from_json_with`];
//! [`TargetConfig::from_json`] has none and refuses them). In the `nvmf` subsystem: `nvmf_create_transport` (`trtype`
//! TCP; `max_queue_depth`, `max_io_qpairs_per_ctrlr`,
//! `in_capsule_data_size`, `max_io_size`, `max_aq_depth`,
//! `num_shared_buffers`, `io_unit_size`, `buf_cache_size`; SPDK's
//! other tuning parameters and `zcopy` are accepted and ignored; pollux-specific,
//! which SPDK does not know: `icreq_timeout_ms` and `connect_timeout_ms`,
//! the handshake timeouts of [`TransportOptions`], `send_iov`,
//! `max_unbound_connections` and `data_timeout_ms`),
//! `nvmf_create_subsystem` (`nqn`, `serial_number`, `model_number`, `allow_any_host`,
//! `max_namespaces`), `nvmf_subsystem_add_ns` (`nqn`, `namespace.bdev_name`,
//! `namespace.nsid`), `nvmf_subsystem_add_listener` (`nqn`,
//! `listen_address.{trtype,adrfam,traddr,trsvcid}`),
//! `nvmf_subsystem_add_host` (`nqn`, `host`). `nvmf_set_config`,
//! `nvmf_set_max_subsystems` and `nvmf_set_crdt` are ignored with a
//! warning. Anything else is refused naming the method and parameter.
//! Parameters are read by `pollux_bdev::params`, the reader of the bdev
//! subsystem's methods too, so both are refused in the same words
//! (`<method>: parameter 'namespace.nsid': expected ..., got ...`).
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use pollux_bdev::config::NvmeAttach;
use pollux_bdev::params::{ParamError, Params};
use pollux_bdev::Bdev;
use pollux_spec::fabrics::{validate_nqn, DISCOVERY_NQN};
use serde_json::{Map, Value};

/// Why a configuration was refused; every message names the culprit.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("JSON configuration: {0}")]
    Json(#[from] serde_json::Error),
    #[error("JSON configuration: {0}")]
    Shape(String),
    #[error(transparent)]
    Bdev(#[from] pollux_bdev::config::ConfigError),
    #[error("JSON configuration: method '{method}' (nvmf subsystem) is not supported; supported: nvmf_create_transport, nvmf_create_subsystem, nvmf_subsystem_add_ns, nvmf_subsystem_add_listener, nvmf_subsystem_add_host")]
    UnknownMethod { method: String },
    /// A method's parameter is unknown, missing or ill-typed (read by
    /// the bdev configuration's reader, worded as its errors are).
    #[error("JSON configuration: {0}")]
    Param(#[from] ParamError),
    #[error("subsystem '{nqn}': {why}")]
    Subsystem { nqn: String, why: String },
    #[error("transport option {option} = {value}: {why}")]
    Transport {
        option: &'static str,
        value: u64,
        why: String,
    },
}

/// Transport options (SPDK's `nvmf_create_transport` names where SPDK has
/// one) and the switches of the data path's techniques.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportOptions {
    /// Entries of an I/O queue at most (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// Entries of the admin queue at most.
    pub max_aq_depth: u16,
    /// I/O queues per controller at most.
    pub max_io_qpairs_per_ctrlr: u16,
    /// In-capsule data bytes of an I/O command capsule (IOCCSZ).
    pub in_capsule_data_size: u32,
    /// In-capsule data bytes of an admin command capsule (NVMe/TCP: at
    /// least 8 KiB).
    pub admin_in_capsule_data_size: u32,
    /// Largest transfer of one command (MDTS), a power of two ≥ 4 KiB.
    pub max_io_size: u32,
    /// MAXH2CDATA announced in ICResp.
    pub max_h2c_data: u32,
    /// Connections bound to an NVM subsystem (a Connect accepted) at
    /// once at most; a Connect beyond is refused (Controller Busy).
    pub max_connections: usize,
    /// Connections not bound to an NVM subsystem (handshake not done, or
    /// a discovery controller's) at once at most, split evenly between
    /// the threads; a new connection beyond a thread's share closes the
    /// one of them that has received nothing for longest, so such
    /// connections cannot take data hosts' places (pollux-specific; JSON
    /// `max_unbound_connections`).
    pub max_unbound_connections: usize,
    /// Keep Alive granularity, 100 ms units (KAS).
    pub kas: u16,
    /// Bytes of each connection's receive buffer.
    pub rx_buffer: usize,
    /// Place each connection on the runtime thread whose core receives
    /// its packets (`SO_INCOMING_CPU`), else round robin.
    pub incoming_cpu: bool,
    /// Idle threads sleep in epoll on their sockets; off: they poll.
    pub epoll_idle: bool,
    /// Receive large data straight into the command's buffer (one
    /// `readv` into buffer and receive buffer) instead of copying it.
    pub direct_receive: bool,
    /// Most iovecs in one `sendmsg` (1..=[`MAX_SEND_IOV`]; JSON
    /// `send_iov`, pollux-specific). Each response is one or two (header,
    /// data): fewer, larger sends cost the kernel less per byte.
    pub send_iov: usize,
    /// A connection whose ICReq has not arrived this long after it was
    /// accepted is closed (pollux-specific; JSON `icreq_timeout_ms`).
    pub icreq_timeout: Duration,
    /// A connection whose queue is not connected (Fabrics Connect
    /// accepted) this long after its ICResp is closed (pollux-specific;
    /// JSON `connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// Data buffers of the whole target: `num_shared_buffers` units of
    /// `io_unit_size` bytes (SPDK's names). A command whose data needs a
    /// buffer the budget cannot give waits (no R2T sent yet).
    pub num_shared_buffers: u32,
    pub io_unit_size: u32,
    /// Free buffers each thread keeps, in `io_unit_size` units (SPDK's
    /// `buf_cache_size`; None: SPDK's default, three quarters of the
    /// pool split between the threads).
    pub buf_cache_size: Option<u32>,
    /// A command whose data (H2CData after its R2T) has not all arrived
    /// this long after the R2T completes with Transient Transport Error,
    /// and a connection whose host takes none of the data queued for it
    /// this long is closed, so their buffers come back (pollux-specific;
    /// JSON `data_timeout_ms`).
    pub data_timeout: Duration,
}

/// Most iovecs in one `sendmsg`: a header and a data segment for each
/// command of a queue of depth 256, so a full queue's responses go out in
/// one call.
pub const MAX_SEND_IOV: usize = 512;

/// Longest handshake timeout accepted.
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3600);

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            max_queue_depth: 128,
            max_aq_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            in_capsule_data_size: 4096,
            admin_in_capsule_data_size: 8192,
            max_io_size: 128 << 10,
            max_h2c_data: 128 << 10,
            max_connections: 1024,
            max_unbound_connections: 256,
            kas: 1,
            rx_buffer: 64 << 10,
            incoming_cpu: false,
            epoll_idle: true,
            direct_receive: true,
            send_iov: MAX_SEND_IOV,
            icreq_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            num_shared_buffers: 511,
            io_unit_size: 128 << 10,
            buf_cache_size: None,
            data_timeout: Duration::from_secs(30),
        }
    }
}

/// Largest data buffer pool accepted.
const MAX_POOL_BYTES: u64 = 1 << 40;

impl TransportOptions {
    /// Bytes of data buffers the target may hold (`num_shared_buffers` x
    /// `io_unit_size`).
    pub fn pool_bytes(&self) -> u64 {
        self.num_shared_buffers as u64 * self.io_unit_size as u64
    }

    /// Bytes of free buffers each of `threads` threads may cache.
    pub(crate) fn cache_bytes(&self, threads: usize) -> u64 {
        let units = match self.buf_cache_size {
            Some(c) => c as u64,
            None => self.num_shared_buffers as u64 * 3 / 4 / threads.max(1) as u64,
        };
        units * self.io_unit_size as u64
    }

    /// Checks the bounds the data path relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |option, value: u64, why: &str| {
            Err(ConfigError::Transport {
                option,
                value,
                why: why.into(),
            })
        };
        if !(2..=4096).contains(&self.max_queue_depth) {
            return bad(
                "max_queue_depth",
                self.max_queue_depth as u64,
                "must be 2..=4096",
            );
        }
        if !(2..=4096).contains(&self.max_aq_depth) {
            return bad("max_aq_depth", self.max_aq_depth as u64, "must be 2..=4096");
        }
        if self.max_io_qpairs_per_ctrlr == 0 {
            return bad("max_io_qpairs_per_ctrlr", 0, "must be at least 1");
        }
        if !self.in_capsule_data_size.is_multiple_of(16) || self.in_capsule_data_size > (1 << 20) {
            return bad(
                "in_capsule_data_size",
                self.in_capsule_data_size as u64,
                "must be a multiple of 16 up to 1 MiB",
            );
        }
        if self.admin_in_capsule_data_size < 8192 || self.admin_in_capsule_data_size > (1 << 20) {
            return bad(
                "admin_in_capsule_data_size",
                self.admin_in_capsule_data_size as u64,
                "must be 8 KiB..=1 MiB (NVMe/TCP admin capsules carry 8 KiB)",
            );
        }
        if !self.max_io_size.is_power_of_two() || !(4096..=(16 << 20)).contains(&self.max_io_size) {
            return bad(
                "max_io_size",
                self.max_io_size as u64,
                "must be a power of two from 4 KiB to 16 MiB",
            );
        }
        if self.max_h2c_data < 4096 || !self.max_h2c_data.is_multiple_of(4) {
            return bad(
                "max_h2c_data",
                self.max_h2c_data as u64,
                "must be a multiple of 4, at least 4096",
            );
        }
        if self.max_connections == 0 {
            return bad("max_connections", 0, "must be at least 1");
        }
        if self.max_unbound_connections == 0 {
            return bad("max_unbound_connections", 0, "must be at least 1");
        }
        for (option, t) in [
            ("icreq_timeout_ms", self.icreq_timeout),
            ("connect_timeout_ms", self.connect_timeout),
        ] {
            if t < Duration::from_millis(1) || t > MAX_HANDSHAKE_TIMEOUT {
                return bad(
                    option,
                    t.as_millis().min(u64::MAX as u128) as u64,
                    "must be 1 ms..=1 hour",
                );
            }
        }
        if self.io_unit_size < 4096 || !self.io_unit_size.is_multiple_of(4096) {
            return bad(
                "io_unit_size",
                self.io_unit_size as u64,
                "must be a multiple of 4096",
            );
        }
        if self.pool_bytes() < self.max_io_size as u64 {
            return bad(
                "num_shared_buffers",
                self.num_shared_buffers as u64,
                &format!(
                    "num_shared_buffers x io_unit_size ({} bytes) must hold one max_io_size transfer ({} bytes)",
                    self.pool_bytes(),
                    self.max_io_size
                ),
            );
        }
        if self.pool_bytes() > MAX_POOL_BYTES {
            return bad(
                "num_shared_buffers",
                self.num_shared_buffers as u64,
                "num_shared_buffers x io_unit_size must be at most 1 TiB",
            );
        }
        if let Some(c) = self.buf_cache_size {
            if c > self.num_shared_buffers {
                return bad(
                    "buf_cache_size",
                    c as u64,
                    "must be at most num_shared_buffers",
                );
            }
        }
        if self.data_timeout < Duration::from_millis(1) || self.data_timeout > MAX_HANDSHAKE_TIMEOUT
        {
            return bad(
                "data_timeout_ms",
                self.data_timeout.as_millis().min(u64::MAX as u128) as u64,
                "must be 1 ms..=1 hour",
            );
        }
        if !(1..=MAX_SEND_IOV).contains(&self.send_iov) {
            return bad("send_iov", self.send_iov as u64, "must be 1..=512");
        }
        if self.rx_buffer < 4096 {
            return bad(
                "rx_buffer",
                self.rx_buffer as u64,
                "must be at least 4096 bytes",
            );
        }
        Ok(())
    }
}

/// A namespace: a bdev by name, with an optional NSID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub bdev: String,
    pub nsid: Option<u32>,
}

/// One NVM subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Serial number (default: made from the NQN).
    pub serial: Option<String>,
    /// Model number (default "pollux").
    pub model: Option<String>,
    /// Any host may connect; else only `hosts`.
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub namespaces: Vec<NamespaceConfig>,
    /// Where it is reachable (port 0: any free port, for tests).
    pub listeners: Vec<SocketAddr>,
}

impl SubsystemConfig {
    pub fn new(nqn: &str) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.to_string(),
            serial: None,
            model: None,
            allow_any_host: true,
            hosts: Vec::new(),
            namespaces: Vec::new(),
            listeners: Vec::new(),
        }
    }
}

/// The whole target.
#[derive(Default)]
pub struct TargetConfig {
    pub transport: TransportOptions,
    pub subsystems: Vec<SubsystemConfig>,
    /// The bdevs namespaces name.
    pub bdevs: Vec<Bdev>,
    /// Warnings met while reading (also logged).
    pub warnings: Vec<String>,
}

impl Clone for TargetConfig {
    fn clone(&self) -> Self {
        TargetConfig {
            transport: self.transport.clone(),
            subsystems: self.subsystems.clone(),
            bdevs: self.bdevs.clone(),
            warnings: self.warnings.clone(),
        }
    }
}

impl std::fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetConfig")
            .field("transport", &self.transport)
            .field("subsystems", &self.subsystems)
            .field(
                "bdevs",
                &self.bdevs.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

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
    /// Checks names, NQNs, namespaces and listeners against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.transport.validate()?;
        for (i, s) in self.subsystems.iter().enumerate() {
            let bad = |why: String| {
                Err(ConfigError::Subsystem {
                    nqn: s.nqn.clone(),
                    why,
                })
            };
            if let Err(e) = validate_nqn(&s.nqn) {
                return bad(format!("invalid NQN: {e}"));
            }
            if s.nqn == DISCOVERY_NQN {
                return bad("the discovery NQN is the target's own discovery subsystem".into());
            }
            if self.subsystems[..i].iter().any(|o| o.nqn == s.nqn) {
                return bad("defined twice".into());
            }
            for h in &s.hosts {
                if let Err(e) = validate_nqn(h) {
                    return bad(format!("host NQN {h:?}: {e}"));
                }
            }
            if s.listeners.is_empty() {
                return bad("no listener (nvmf_subsystem_add_listener / --listen)".into());
            }
            let mut nsids: Vec<u32> = Vec::new();
            for (k, ns) in s.namespaces.iter().enumerate() {
                if !self.bdevs.iter().any(|b| b.name() == ns.bdev) {
                    return bad(format!("namespace bdev '{}' does not exist", ns.bdev));
                }
                nsids.push(ns.nsid.unwrap_or(k as u32 + 1));
            }
            let mut sorted = nsids.clone();
            sorted.sort_unstable();
            for (k, id) in sorted.iter().enumerate() {
                if *id != k as u32 + 1 {
                    return bad(format!(
                        "namespace IDs {nsids:?}: must be 1..={} without gaps (NSID {id})",
                        sorted.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The namespaces' bdevs of subsystem `s` in NSID order.
    pub(crate) fn ns_bdevs(&self, s: &SubsystemConfig) -> Vec<Bdev> {
        let mut v: Vec<(u32, Bdev)> = s
            .namespaces
            .iter()
            .enumerate()
            .filter_map(|(k, ns)| {
                let b = self.bdevs.iter().find(|b| b.name() == ns.bdev)?;
                Some((ns.nsid.unwrap_or(k as u32 + 1), b.clone()))
            })
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v.into_iter().map(|(_, b)| b).collect()
    }

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
        let doc: Value = serde_json::from_str(json)?;
        let subsystems = pollux_bdev::config::subsystems(&doc)?;
        let mut cfg = TargetConfig::default();
        let mut bdev_doc = None;
        let mut nvmf: &[Value] = &[];
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
                Some(other) => cfg.warn(format!("subsystem '{other}' ignored")),
                None => {
                    return Err(ConfigError::Shape(
                        "a subsystem entry has no \"subsystem\" name".into(),
                    ))
                }
            }
        }
        if let Some(b) = bdev_doc {
            let only = serde_json::json!({ "subsystems": [b] }).to_string();
            let bc = pollux_bdev::config::Config::parse(&only)?;
            cfg.warnings.extend(bc.warnings.iter().cloned());
            cfg.bdevs = bc.create(attach)?;
        }
        for e in nvmf {
            cfg.apply(e)?;
        }
        cfg.validate()?;
        Ok(cfg)
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
                p.known(&[
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
                    "send_iov",
                    "max_unbound_connections",
                    "data_timeout_ms",
                ])?;
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
                if let Some(v) = p.uint("send_iov", 1, MAX_SEND_IOV as u64)? {
                    t.send_iov = v as usize;
                }
                if let Some(v) = p.uint("max_unbound_connections", 1, 1 << 20)? {
                    t.max_unbound_connections = v as usize;
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
                p.bool_opt("zcopy")?;
                for ignored in [
                    "sock_priority",
                    "abort_timeout_sec",
                    "ack_timeout",
                    "data_wr_pool_size",
                    "control_msg_num",
                    "c2h_success",
                    "zcopy",
                ] {
                    if params.contains_key(ignored) {
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
                p.uint("max_namespaces", 0, 1024)?;
                if p.bool_opt("ana_reporting")? == Some(true) {
                    return Err(p.bad("ana_reporting", "ANA is not supported").into());
                }
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
                for ignored in ["uuid", "nguid", "eui64"] {
                    if q.get(ignored).is_some() {
                        self.warn(format!(
                            "{method}: namespace.{ignored} ignored (identifiers derive from the serial number)"
                        ));
                    }
                }
                let s = self.subsystem_mut(&p)?;
                s.namespaces.push(NamespaceConfig { bdev, nsid });
            }
            "nvmf_subsystem_add_listener" => {
                p.known(&[
                    "nqn",
                    "listen_address",
                    "tgt_name",
                    "secure_channel",
                    "ana_state",
                ])?;
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
                let nqn = p.str_req("nqn")?;
                let addr = SocketAddr::new(ip, port);
                if nqn == DISCOVERY_NQN || nqn == "discovery" {
                    // The discovery subsystem listens wherever any does.
                    self.warn(format!(
                        "{method}: discovery listener {addr} is served by the subsystems' listeners only"
                    ));
                    return Ok(());
                }
                let s = self.subsystem_mut(&p)?;
                if !s.listeners.contains(&addr) {
                    s.listeners.push(addr);
                }
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
                for k in ["psk", "dhchap_key", "dhchap_ctrlr_key"] {
                    if params.contains_key(k) {
                        return Err(p.bad(k, "TLS and authentication are not supported").into());
                    }
                }
                let host = p.str_req("host")?;
                let s = self.subsystem_mut(&p)?;
                if !s.hosts.iter().any(|h| h == host) {
                    s.hosts.push(host.to_string());
                }
            }
            "nvmf_set_config" | "nvmf_set_max_subsystems" | "nvmf_set_crdt" => {
                self.warn(format!("{method} ignored"));
            }
            _ => return Err(ConfigError::UnknownMethod { method }),
        }
        Ok(())
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
