//! The target: its subsystems and controllers, the runtime threads
//! serving them, and its listeners.
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};

use pollux_controller::AnaPort;
use pollux_runtime::{Runtime, RuntimeHandle, RuntimeOptions, SignalWatcher};
use pollux_spec::fabrics::DISCOVERY_NQN;
use pollux_spec::log::AnaState;

use crate::auth::state::HostSecrets;
use crate::config::{ConfigError, Keyring, TargetConfig, TransportOptions};
use crate::model::{ModelError, Subsys, SubsysParams};
use crate::shared::{Shared, SubsysEntry};
use crate::tcp::server::{init, Listeners, TcpShared};

/// Why a target did not start.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("subsystem '{nqn}': {source}")]
    Model {
        nqn: String,
        #[source]
        source: ModelError,
    },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] pollux_runtime::Error),
    #[error("sock_impl '{name}': {source}")]
    SockImpl {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A serial number made from the NQN (at most 20 characters).
pub(crate) fn default_serial(nqn: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in nqn.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("PLX{:016X}", h)[..19].to_string()
}

/// The live configuration's bookkeeping (what the runtime threads do not
/// need).
pub(crate) struct Live {
    /// The TCP transport was created (listed by `nvmf_get_transports`).
    pub transport: bool,
    /// The next subsystem's `SubsysEntry::id`.
    pub next_id: u64,
    /// The sockets listened on: (address asked for, address bound).
    pub sockets: Vec<(SocketAddr, SocketAddr)>,
    /// The discovery subsystem's own listeners (bound addresses).
    pub discovery: Vec<SocketAddr>,
    /// The DH-HMAC-CHAP keys hosts may be given by name.
    pub keyring: Keyring,
}

impl Live {
    /// The bound address of `addr` (asked for or bound).
    pub fn bound(&self, addr: SocketAddr) -> Option<SocketAddr> {
        self.sockets
            .iter()
            // (A port 0 asked for is a new free port each time.)
            .find(|(c, r)| (*c == addr && addr.port() != 0) || *r == addr)
            .map(|(_, r)| *r)
    }
}

/// What a subsystem's controllers take from the transport options.
pub(crate) fn subsys_params(
    o: &TransportOptions,
    nqn: &str,
    serial: Option<&str>,
    model: Option<&str>,
) -> SubsysParams {
    SubsysParams {
        nqn: nqn.to_string(),
        serial: serial.map_or_else(|| default_serial(nqn), str::to_string),
        model: model.unwrap_or("pollux").to_string(),
        queue_entries: o.max_queue_depth,
        max_io_queues: o.max_io_qpairs_per_ctrlr,
        max_io_size: o.max_io_size,
        in_capsule_data: o.in_capsule_data_size,
        kas: o.kas,
        ana_reporting: false,
        multipath: false,
    }
}

/// The target's discovery subsystem.
pub(crate) fn discovery_subsys(o: &TransportOptions) -> Result<Subsys, TargetError> {
    let dp = SubsysParams {
        nqn: DISCOVERY_NQN.into(),
        serial: "pollux-discovery".into(),
        model: "pollux discovery".into(),
        queue_entries: o.max_aq_depth,
        max_io_queues: 1,
        max_io_size: o.max_io_size,
        in_capsule_data: 0,
        kas: o.kas,
        ana_reporting: false,
        multipath: false,
    };
    Subsys::new(&dp, Vec::new(), true).map_err(|source| TargetError::Model {
        nqn: DISCOVERY_NQN.into(),
        source,
    })
}

/// What the runtime threads share, replaced as a whole only by
/// `create_transport` (before any listener, subsystem or connection).
#[derive(Clone)]
pub(crate) struct Current {
    pub shared: Arc<Shared>,
    /// The TCP transport's (connections, data buffer pool).
    pub tcp: Arc<TcpShared>,
}

/// A running NVMe/TCP target.
pub struct Target {
    pub(crate) rt: RuntimeHandle,
    pub(crate) cur: RwLock<Current>,
    /// The live configuration's bookkeeping (see `live`); its mutex
    /// serializes live changes.
    pub(crate) live: Mutex<Live>,
}

impl Target {
    /// Binds the listeners, builds the subsystems and starts one runtime
    /// thread per core of `cores` serving connections.
    pub fn start(
        cfg: TargetConfig,
        cores: &[usize],
        rt_opts: RuntimeOptions,
    ) -> Result<Target, TargetError> {
        cfg.validate()?;
        let o = cfg.transport.clone();
        if o.sock_impl == crate::config::SockImpl::Uring {
            crate::tcp::uring::probe(&o).map_err(|source| TargetError::SockImpl {
                name: o.sock_impl.name(),
                source,
            })?;
        }
        let listen = Listeners::bind(
            cfg.subsystems
                .iter()
                .flat_map(|s| s.listeners.iter().copied())
                .chain(cfg.discovery_listeners.iter().copied()),
            &o,
        )
        .map_err(|(addr, source)| TargetError::Listen { addr, source })?;
        let mut subsystems = Vec::new();
        for (k, s) in cfg.subsystems.iter().enumerate() {
            // (validate checked that the keyring has every key named.)
            let key = |n: &String| cfg.keyring.get(n).cloned();
            let host_keys = s
                .host_keys
                .iter()
                .filter_map(|h| {
                    Some(HostSecrets {
                        host: h.host.clone(),
                        key: key(&h.key)?,
                        ctrlr_key: match &h.ctrlr_key {
                            Some(c) => Some(key(c)?),
                            None => None,
                        },
                    })
                })
                .collect();
            let mut p = subsys_params(&o, &s.nqn, s.serial.as_deref(), s.model.as_deref());
            p.ana_reporting = s.ana_reporting;
            p.multipath = s.ana_reporting
                || (s.min_cntlid, s.max_cntlid)
                    != (crate::config::CNTLID_MIN, crate::config::CNTLID_MAX);
            let model = Subsys::with_namespaces(&p, cfg.ns_specs(s)).map_err(|source| {
                TargetError::Model {
                    nqn: s.nqn.clone(),
                    source,
                }
            })?;
            let ana_ports = s
                .listeners
                .iter()
                .map(|a| {
                    let port = Arc::new(AnaPort::new(AnaState::Optimized));
                    for (_, g, st) in s.ana_states.iter().filter(|(l, _, _)| l == a) {
                        port.set(*g, *st);
                    }
                    (listen.real(a), port)
                })
                .collect();
            subsystems.push(Arc::new(SubsysEntry {
                id: k as u64 + 1,
                model,
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                host_keys,
                listeners: s.listeners.iter().map(|a| listen.real(a)).collect(),
                max_namespaces: s.max_namespaces,
                cntlids: (s.min_cntlid, s.max_cntlid),
                ana_ports,
            }));
        }
        let live = Live {
            transport: cfg.transport_created
                || !cfg.subsystems.is_empty()
                || !cfg.discovery_listeners.is_empty(),
            next_id: subsystems.len() as u64 + 1,
            sockets: listen.pairs(),
            discovery: cfg
                .discovery_listeners
                .iter()
                .map(|a| listen.real(a))
                .collect(),
            keyring: cfg.keyring.clone(),
        };
        let discovery = discovery_subsys(&o)?;
        let tcp = Arc::new(TcpShared::new(&o, cores));
        let shared = Arc::new(Shared {
            opts: o,
            subsystems: RwLock::new(subsystems),
            discovery,
            listeners: RwLock::new(listen.addrs()),
            genctr: 1.into(),
            auth: cfg.auth,
            dh: Arc::new(crate::auth::pool::DhPool::new(&cfg.auth)),
            ctrls: Mutex::default(),
            data_conns: Default::default(),
        });
        // Thread 0 accepts.
        let listeners = Arc::new(Mutex::new(Some(listen)));
        let (sh, tc) = (shared.clone(), tcp.clone());
        let rt = Runtime::start_with(cores, rt_opts, move |ctx| {
            let ls = if ctx.index() == 0 {
                listeners.lock().unwrap_or_else(|p| p.into_inner()).take()
            } else {
                None
            };
            init(ctx, sh.clone(), tc.clone(), ls);
        })?;
        for a in &shared.listeners() {
            tracing::info!(listen = %a, "NVMe/TCP target listening");
        }
        Ok(Target {
            rt,
            cur: RwLock::new(Current { shared, tcp }),
            live: Mutex::new(live),
        })
    }

    /// What the runtime threads share now.
    pub(crate) fn current(&self) -> Current {
        self.cur.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The socket implementation of the target's threads (chosen at
    /// start).
    pub fn sock_impl(&self) -> crate::config::SockImpl {
        self.shared().opts.sock_impl
    }

    /// The addresses listened on (configured port 0 resolved).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.shared().listeners()
    }

    /// Each NVM subsystem's NQN and the addresses it is served on
    /// (configured port 0 resolved), in creation order.
    pub fn subsystem_listeners(&self) -> Vec<(String, Vec<SocketAddr>)> {
        self.shared()
            .subsystems()
            .iter()
            .map(|e| (e.model.nqn().to_string(), e.listeners.clone()))
            .collect()
    }

    /// Controllers (host associations) alive.
    pub fn controllers(&self) -> usize {
        self.shared().table().map.len()
    }

    /// What the target's threads share (tests drive connections over
    /// memory with it).
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.current().shared
    }

    /// The data buffer pool (tests check what connections give back).
    pub(crate) fn pool(&self) -> Arc<crate::pool::Pool> {
        self.current().tcp.pool.clone()
    }

    /// The runtime (tests run connections on its threads; the management
    /// server reads its thread statistics).
    pub fn runtime(&self) -> &RuntimeHandle {
        &self.rt
    }

    /// Bytes of data buffers alive (in commands, or cached by the
    /// threads), and the pool's limit (`num_shared_buffers` x
    /// `io_unit_size`; in-capsule and admin data may pass it).
    pub fn buffer_bytes(&self) -> (usize, usize) {
        let tcp = self.current().tcp;
        (tcp.pool.used(), tcp.pool.limit())
    }

    /// Connections open.
    pub fn connections(&self) -> usize {
        self.current().tcp.conns.load(Relaxed)
    }

    /// Shuts down on SIGINT/SIGTERM (see [`Target::shutdown`]).
    pub fn stop_on_signals(&self) -> Result<SignalWatcher, TargetError> {
        Ok(self.rt.stop_on_signals()?)
    }

    /// Waits until the target has shut down.
    pub fn wait(&self) -> Result<(), TargetError> {
        Ok(self.rt.wait()?)
    }

    /// Stops accepting, lets commands in flight finish and their
    /// responses go out, closes every connection and joins the threads.
    pub fn shutdown(&self) -> Result<(), TargetError> {
        Ok(self.rt.shutdown()?)
    }
}
