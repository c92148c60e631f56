//! The target configured while it runs, as SPDK's `nvmf_tgt` is by its
//! JSON-RPC methods: the TCP transport, subsystems, their hosts and
//! listeners, the listings (`nvmf_get_subsystems`,
//! `nvmf_subsystem_get_controllers`, `nvmf_subsystem_get_qpairs`,
//! `nvmf_get_transports`) and `save_config`'s nvmf part. Namespaces are
//! `live_ns`'s.
//!
//! Every method takes `&Target` and may be called from any thread but a
//! runtime thread, while hosts are connected. Changes are serialized by
//! the `Live` mutex; each replaces a subsystem in `Shared::subsystems`
//! (copy on write, under its write lock), then closes what it must on
//! the connections' threads: Connect reads the subsystems under the read
//! lock until the controller table has its queue, so a queue connected
//! through a change is either refused or found and closed. Nothing here
//! is on the I/O path.
mod auth;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use pollux_spec::fabrics::{check_nqn, DISCOVERY_NQN};
use serde_json::{json, Value};

use crate::auth::state::host_json;
use crate::config::{AuthOptions, ConfigError, TransportOptions};
use crate::model::{ModelError, Subsys};
use crate::shared::{ConnRef, Shared, SubsysEntry, SubsysId};
use crate::tcp::server::{replace_shared, start_listening, stop_listening, Listeners, TcpShared};
use crate::tgt::{discovery_subsys, subsys_params, Current, Live, Target, TargetError};

/// Why a live change was refused; each names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("transport type '{trtype}': only TCP is supported")]
    UnsupportedTransport { trtype: String },
    #[error("transport 'TCP' already exists")]
    TransportExists,
    #[error("transport 'TCP' cannot be created after subsystems or listeners (its options are their controllers' limits): create it first")]
    TransportTooLate,
    #[error("transport options: {0}")]
    TransportOptions(#[source] ConfigError),
    #[error("sock_impl '{asked}': the target's threads run '{running}' (chosen at start: --sock-impl, or the configuration's nvmf_create_transport)")]
    SockImpl {
        asked: &'static str,
        running: &'static str,
    },
    #[error("{option} {asked}: the target's threads were started with {running} (chosen at start: pollux target's flag, or the configuration's nvmf_create_transport)")]
    ChosenAtStart {
        option: &'static str,
        asked: String,
        running: String,
    },
    #[error("no transport 'TCP' (nvmf_create_transport first)")]
    NoTransport,
    #[error("subsystem '{nqn}' already exists")]
    SubsystemExists { nqn: String },
    #[error("no subsystem '{nqn}'")]
    NoSubsystem { nqn: String },
    #[error("subsystem '{nqn}': {why}")]
    InvalidSubsystem { nqn: String, why: String },
    #[error("subsystem '{nqn}': host '{host}': {why}")]
    InvalidHost {
        nqn: String,
        host: String,
        why: String,
    },
    #[error("subsystem '{nqn}' has no host '{host}'")]
    NoHost { nqn: String, host: String },
    /// A key file refused (`keyring_file_add_key`), never its contents.
    #[error("{0}")]
    Key(String),
    #[error("no key '{name}' in the keyring")]
    NoKey { name: String },
    #[error("subsystem '{nqn}' already listens on {addr}")]
    ListenerExists { nqn: String, addr: SocketAddr },
    #[error("subsystem '{nqn}' does not listen on {addr}")]
    NoListener { nqn: String, addr: SocketAddr },
    #[error("listen address: {why}")]
    InvalidAddress { why: String },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("subsystem '{nqn}': {source}")]
    Model {
        nqn: String,
        #[source]
        source: ModelError,
    },

    /// The discovery subsystem has no namespaces.
    #[error("subsystem '{nqn}' is the discovery subsystem: it has no namespaces")]
    Discovery { nqn: String },
    /// The NSID asked for is taken.
    #[error("subsystem '{nqn}': namespace ID {nsid} is taken")]
    NsidTaken { nqn: String, nsid: u32 },
    /// No namespace of that NSID.
    #[error("subsystem '{nqn}': no namespace of ID {nsid}")]
    NoNamespace { nqn: String, nsid: u32 },
    /// The NSID cannot be a namespace's.
    #[error("subsystem '{nqn}': namespace ID {nsid} {why}")]
    InvalidNsid {
        nqn: String,
        nsid: u32,
        why: &'static str,
    },
    /// The bdev cannot be a namespace.
    #[error("subsystem '{nqn}': bdev {bdev}: {why}")]
    InvalidBdev {
        nqn: String,
        bdev: String,
        why: String,
    },
    /// Anything else the controller model refused.
    #[error("subsystem '{nqn}': {why}")]
    Other { nqn: String, why: String },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Runtime(#[from] pollux_runtime::Error),
}

impl LiveError {
    /// The errno SPDK's handlers answer such a refusal with (the JSON-RPC
    /// error code is its negative).
    pub fn errno(&self) -> i32 {
        match self {
            LiveError::TransportExists
            | LiveError::SubsystemExists { .. }
            | LiveError::ListenerExists { .. } => libc::EEXIST,
            LiveError::NsidTaken { .. } => libc::EEXIST,
            LiveError::NoSubsystem { .. }
            | LiveError::NoTransport
            | LiveError::NoNamespace { .. } => libc::ENODEV,
            LiveError::NoHost { .. } | LiveError::NoListener { .. } | LiveError::NoKey { .. } => {
                libc::ENOENT
            }
            LiveError::Listen { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EINVAL,
        }
    }
}

/// A subsystem's settings at creation (SPDK's `nvmf_create_subsystem`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubsystemOptions {
    /// Serial number (default: made from the NQN).
    pub serial_number: Option<String>,
    /// Model number (default "pollux").
    pub model_number: Option<String>,
    /// Any host may connect (SPDK's default: no).
    pub allow_any_host: bool,
    /// SPDK's `max_namespaces` (0: no limit of its own).
    pub max_namespaces: u32,
    /// SPDK's `ana_reporting`.
    pub ana_reporting: bool,
    /// SPDK's `min_cntlid`, `max_cntlid` (None: 1, FFEFh).
    pub min_cntlid: Option<u16>,
    pub max_cntlid: Option<u16>,
}

/// A listen address from SPDK's `listen_address` fields (`trtype` TCP,
/// `adrfam` IPv4/IPv6 or none, `traddr` an IP address, `trsvcid` a port,
/// 4420 if none).
pub fn listen_address(
    trtype: &str,
    adrfam: Option<&str>,
    traddr: &str,
    trsvcid: Option<&str>,
) -> Result<SocketAddr, LiveError> {
    if !trtype.eq_ignore_ascii_case("tcp") {
        return Err(LiveError::UnsupportedTransport {
            trtype: trtype.into(),
        });
    }
    let bad = |why: String| Err(LiveError::InvalidAddress { why });
    let Ok(ip) = traddr.parse::<IpAddr>() else {
        return bad(format!("traddr '{traddr}' is not an IP address"));
    };
    let port = match trsvcid {
        None => 4420,
        Some(s) => match s.parse::<u16>() {
            Ok(p) => p,
            Err(_) => return bad(format!("trsvcid '{s}' is not a port number")),
        },
    };
    if let Some(f) = adrfam {
        let ok = (f.eq_ignore_ascii_case("ipv4") && ip.is_ipv4())
            || (f.eq_ignore_ascii_case("ipv6") && ip.is_ipv6());
        if !ok {
            return bad(format!("adrfam '{f}' does not match traddr '{traddr}'"));
        }
    }
    Ok(SocketAddr::new(ip, port))
}

/// SPDK's `listen_address` object for `a`.
pub(crate) fn address_json(a: &SocketAddr) -> Value {
    json!({
        "trtype": "TCP",
        "adrfam": if a.is_ipv4() { "IPv4" } else { "IPv6" },
        "traddr": a.ip().to_string(),
        "trsvcid": a.port().to_string(),
    })
}

/// A UUID's text form.
fn uuid_str(b: &[u8; 16]) -> String {
    crate::config::uuid_string(b)
}

/// The discovery subsystem's NQN, or SPDK's client's shortcut for it.
fn is_discovery(nqn: &str) -> bool {
    nqn == DISCOVERY_NQN || nqn == "discovery"
}

impl Target {
    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The subsystem `nqn` (never the discovery one).
    fn entry(shared: &Shared, nqn: &str) -> Result<Arc<SubsysEntry>, LiveError> {
        shared
            .subsystems()
            .iter()
            .find(|s| s.model.nqn() == nqn)
            .cloned()
            .ok_or_else(|| LiveError::NoSubsystem { nqn: nqn.into() })
    }

    /// Replaces subsystem `nqn` by `f` of it (under the write lock); the
    /// new version.
    fn change(
        shared: &Shared,
        nqn: &str,
        f: impl FnOnce(&mut SubsysEntry) -> Result<(), LiveError>,
    ) -> Result<Arc<SubsysEntry>, LiveError> {
        let mut subs = shared.subsystems_mut();
        let Some(k) = subs.iter().position(|s| s.model.nqn() == nqn) else {
            return Err(LiveError::NoSubsystem { nqn: nqn.into() });
        };
        let mut e = (*subs[k]).clone();
        f(&mut e)?;
        let e = Arc::new(e);
        subs[k] = e.clone();
        shared.genctr.fetch_add(1, Relaxed);
        Ok(e)
    }

    /// Closes the connections `refs` (on their threads).
    fn close_conns(&self, refs: impl IntoIterator<Item = ConnRef>) {
        for r in refs {
            let (conn, close) = (r.conn, r.close);
            if let Err(e) = self.rt.send(r.thread, move |ctx| close(ctx, conn)) {
                tracing::warn!(thread = r.thread, conn, "closing a connection: {e}");
            }
        }
    }

    /// Closes every queue of the controllers of subsystem `id` that
    /// `pick` (host NQN) selects; how many controllers.
    fn close_controllers(&self, shared: &Shared, id: u64, pick: impl Fn(&str) -> bool) -> usize {
        let refs: Vec<Vec<ConnRef>> = shared
            .table()
            .map
            .values()
            .filter(|e| e.subsys == SubsysId::Nvm(id) && pick(&e.hostnqn))
            .map(|e| {
                std::iter::once(e.admin)
                    .chain(e.io.iter().map(|(_, r)| *r))
                    .collect()
            })
            .collect();
        let n = refs.len();
        self.close_conns(refs.into_iter().flatten());
        n
    }

    /// Closes the sockets no subsystem listens on any more.
    fn release_sockets(&self, live: &mut Live, shared: &Shared) -> Result<(), LiveError> {
        let mut used: Vec<SocketAddr> = shared
            .subsystems()
            .iter()
            .flat_map(|s| s.listeners.iter().copied())
            .collect();
        used.extend(live.discovery.iter().copied());
        let unused: Vec<SocketAddr> = live
            .sockets
            .iter()
            .map(|(_, r)| *r)
            .filter(|r| !used.contains(r))
            .collect();
        for addr in unused {
            self.rt.call(0, move |ctx| stop_listening(ctx, addr))?;
            live.sockets.retain(|(_, r)| *r != addr);
            {
                let mut l = shared.listeners.write().unwrap_or_else(|p| p.into_inner());
                l.retain(|a| *a != addr);
            }
            shared.genctr.fetch_add(1, Relaxed);
            tracing::info!(listen = %addr, "NVMe/TCP target no longer listening");
        }
        Ok(())
    }

    /// Creates the TCP transport with `opts` (SPDK's
    /// `nvmf_create_transport`): refused if it exists (SPDK: -EEXIST), or
    /// once a subsystem or listener exists (their controllers' limits
    /// come from the options).
    pub fn create_transport(&self, opts: TransportOptions) -> Result<(), LiveError> {
        let mut live = self.live();
        if live.transport {
            return Err(LiveError::TransportExists);
        }
        opts.validate().map_err(LiveError::TransportOptions)?;
        let cur = self.current();
        // The threads' socket implementation is chosen when they start.
        if opts.sock_impl != cur.shared.opts.sock_impl {
            return Err(LiveError::SockImpl {
                asked: opts.sock_impl.name(),
                running: cur.shared.opts.sock_impl.name(),
            });
        }
        // So are the posix threads' receive gates, and the io_uring
        // threads' rings: their provided receive buffers, registered files,
        // zero-copy sends and registered buffers (each thread's ring is set
        // up when it starts).
        let was = &cur.shared.opts;
        let at_start = |o: &TransportOptions| {
            [
                ("epoll_receive", o.epoll_receive.to_string()),
                ("uring_fixed_files", o.uring_fixed_files.to_string()),
                ("uring_rx_buffers", o.uring_rx_buffers.to_string()),
                ("uring_rx_buffer_size", o.uring_rx_buffer_size.to_string()),
                ("uring_zcopy_threshold", o.uring_zcopy_threshold.to_string()),
                (
                    "uring_registered_buffers",
                    o.uring_registered_buffers.to_string(),
                ),
            ]
        };
        for ((option, asked), (_, running)) in at_start(&opts).into_iter().zip(at_start(was)) {
            if asked != running {
                return Err(LiveError::ChosenAtStart {
                    option,
                    asked,
                    running,
                });
            }
        }
        if !cur.shared.subsystems().is_empty() || !live.sockets.is_empty() {
            return Err(LiveError::TransportTooLate);
        }
        // No listener: no connection, nothing to move to the new state.
        let shared = Arc::new(Shared {
            discovery: discovery_subsys(&opts)?,
            opts,
            subsystems: RwLock::new(Vec::new()),
            listeners: RwLock::new(Vec::new()),
            genctr: (cur.shared.genctr.load(Relaxed) + 1).into(),
            auth: cur.shared.auth,
            dh: cur.shared.dh.clone(),
            ctrls: Mutex::default(),
            data_conns: Default::default(),
        });
        let tcp = Arc::new(TcpShared::new(&shared.opts, self.rt.cores()));
        for i in 0..self.rt.thread_count() {
            let (sh, tc) = (shared.clone(), tcp.clone());
            self.rt.call(i, move |ctx| replace_shared(ctx, sh, tc))?;
        }
        tracing::info!(opts = ?shared.opts, "transport TCP created");
        *self.cur.write().unwrap_or_else(|p| p.into_inner()) = Current { shared, tcp };
        live.transport = true;
        Ok(())
    }

    /// The transport options the target runs with: those it started
    /// with, or `create_transport`'s once it was called.
    pub fn transport_options(&self) -> TransportOptions {
        self.shared().opts.clone()
    }

    /// The transports as SPDK's `nvmf_get_transports` lists them.
    pub fn transports(&self) -> Vec<Value> {
        if !self.live().transport {
            return Vec::new();
        }
        // What save_config writes, and SPDK's other keys of
        // nvmf_get_transports at the values pollux has.
        let mut t = self.shared().opts.create_transport_params();
        let o = &self.shared().opts;
        t["buf_cache_size"] = o.buf_cache_size.unwrap_or(u32::MAX).into();
        for (k, v) in [
            ("zcopy", json!(false)),
            ("c2h_success", json!(true)),
            ("sock_priority", json!(0)),
            ("abort_timeout_sec", json!(1)),
            ("ack_timeout", json!(0)),
            ("data_wr_pool_size", json!(0)),
        ] {
            t[k] = v;
        }
        vec![t]
    }

    /// Creates subsystem `nqn` with no namespace, host or listener
    /// (SPDK's `nvmf_create_subsystem`).
    pub fn create_subsystem(&self, nqn: &str, o: SubsystemOptions) -> Result<(), LiveError> {
        let mut live = self.live();
        let invalid = |why: String| LiveError::InvalidSubsystem {
            nqn: nqn.into(),
            why,
        };
        check_nqn(nqn).map_err(|e| invalid(format!("invalid NQN: {e}")))?;
        if nqn == DISCOVERY_NQN {
            return Err(invalid("the discovery NQN is the target's own".into()));
        }
        let printable = |s: &str| s.bytes().all(|b| (0x20..0x7f).contains(&b));
        if let Some(sn) = &o.serial_number {
            if sn.len() > 20 || !printable(sn) {
                return Err(invalid(format!(
                    "serial number '{sn}': at most 20 printable ASCII characters"
                )));
            }
        }
        if let Some(mn) = &o.model_number {
            if mn.len() > 40 || !printable(mn) {
                return Err(invalid(format!(
                    "model number '{mn}': at most 40 printable ASCII characters"
                )));
            }
        }
        let cntlids = (
            o.min_cntlid.unwrap_or(crate::config::CNTLID_MIN),
            o.max_cntlid.unwrap_or(crate::config::CNTLID_MAX),
        );
        crate::config::check_cntlid_range(cntlids.0, cntlids.1).map_err(invalid)?;
        let shared = self.shared();
        let mut p = subsys_params(
            &shared.opts,
            nqn,
            o.serial_number.as_deref(),
            o.model_number.as_deref(),
        );
        p.ana_reporting = o.ana_reporting;
        p.multipath =
            o.ana_reporting || cntlids != (crate::config::CNTLID_MIN, crate::config::CNTLID_MAX);
        let model = Subsys::new(&p, Vec::new(), false).map_err(|source| LiveError::Model {
            nqn: nqn.into(),
            source,
        })?;
        let mut subs = shared.subsystems_mut();
        if subs.iter().any(|s| s.model.nqn() == nqn) {
            return Err(LiveError::SubsystemExists { nqn: nqn.into() });
        }
        let id = live.next_id;
        live.next_id += 1;
        subs.push(Arc::new(SubsysEntry {
            id,
            model,
            allow_any_host: o.allow_any_host,
            hosts: Vec::new(),
            host_keys: Vec::new(),
            listeners: Vec::new(),
            max_namespaces: o.max_namespaces,
            cntlids,
            ana_ports: Vec::new(),
        }));
        shared.genctr.fetch_add(1, Relaxed);
        tracing::info!(
            nqn,
            serial = p.serial,
            model = p.model,
            allow_any_host = o.allow_any_host,
            ana_reporting = o.ana_reporting,
            min_cntlid = cntlids.0,
            max_cntlid = cntlids.1,
            "subsystem created"
        );
        Ok(())
    }

    /// Deletes subsystem `nqn` and closes its controllers' connections
    /// (SPDK's `nvmf_delete_subsystem`); sockets no other subsystem
    /// listens on close.
    pub fn delete_subsystem(&self, nqn: &str) -> Result<(), LiveError> {
        let mut live = self.live();
        let shared = self.shared();
        let e = {
            let mut subs = shared.subsystems_mut();
            let Some(k) = subs.iter().position(|s| s.model.nqn() == nqn) else {
                return Err(LiveError::NoSubsystem { nqn: nqn.into() });
            };
            shared.genctr.fetch_add(1, Relaxed);
            subs.remove(k)
        };
        let n = self.close_controllers(&shared, e.id, |_| true);
        tracing::info!(nqn, controllers_closed = n, "subsystem deleted");
        self.release_sockets(&mut live, &shared)
    }

    /// Lets any host connect to `nqn`, or only its hosts (SPDK's
    /// `nvmf_subsystem_allow_any_host`; controllers connected stay).
    pub fn allow_any_host(&self, nqn: &str, allow: bool) -> Result<(), LiveError> {
        let _live = self.live();
        Self::change(&self.shared(), nqn, |e| {
            e.allow_any_host = allow;
            Ok(())
        })?;
        tracing::info!(
            nqn,
            allow_any_host = allow,
            "subsystem's host policy changed"
        );
        Ok(())
    }

    /// Allows `host` to connect to `nqn` (SPDK's
    /// `nvmf_subsystem_add_host`; a host listed already: no change).
    pub fn add_host(&self, nqn: &str, host: &str) -> Result<(), LiveError> {
        let _live = self.live();
        check_nqn(host).map_err(|e| LiveError::InvalidHost {
            nqn: nqn.into(),
            host: host.into(),
            why: format!("invalid NQN: {e}"),
        })?;
        Self::change(&self.shared(), nqn, |e| {
            if !e.hosts.iter().any(|h| h == host) {
                e.hosts.push(host.into());
            }
            Ok(())
        })?;
        tracing::info!(nqn, host, "host added to subsystem");
        Ok(())
    }

    /// Takes `host` off `nqn`'s list and closes that host's controllers
    /// of `nqn` (SPDK's `nvmf_subsystem_remove_host`).
    pub fn remove_host(&self, nqn: &str, host: &str) -> Result<(), LiveError> {
        let _live = self.live();
        let shared = self.shared();
        let e = Self::change(&shared, nqn, |e| {
            let before = e.hosts.len();
            e.hosts.retain(|h| h != host);
            e.host_keys.retain(|k| k.host != host);
            if e.hosts.len() == before {
                return Err(LiveError::NoHost {
                    nqn: nqn.into(),
                    host: host.into(),
                });
            }
            Ok(())
        })?;
        let n = self.close_controllers(&shared, e.id, |h| h == host);
        tracing::info!(
            nqn,
            host,
            controllers_closed = n,
            "host removed from subsystem"
        );
        Ok(())
    }

    /// The socket of `addr`: the one bound there already, else bound now
    /// and accepted on by thread 0; its bound address.
    fn socket(
        &self,
        live: &mut Live,
        shared: &Shared,
        addr: SocketAddr,
    ) -> Result<SocketAddr, LiveError> {
        if let Some(r) = live.bound(addr) {
            return Ok(r);
        }
        let l = Listeners::bind([addr], &shared.opts)
            .map_err(|(addr, source)| LiveError::Listen { addr, source })?;
        let real = l.addrs()[0];
        let sock = l.into_sockets().remove(0);
        self.rt.call(0, move |ctx| start_listening(ctx, sock))?;
        live.sockets.push((addr, real));
        shared
            .listeners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(real);
        tracing::info!(listen = %real, "NVMe/TCP target listening");
        Ok(real)
    }

    /// Serves `nqn` on `addr` too (SPDK's `nvmf_subsystem_add_listener`):
    /// binds the socket unless another subsystem listens there already;
    /// the address bound (a port 0 resolved). The discovery subsystem
    /// (its NQN, or "discovery") is served on every listener, and on
    /// those given to it too.
    pub fn add_listener(&self, nqn: &str, addr: SocketAddr) -> Result<SocketAddr, LiveError> {
        let mut live = self.live();
        if !live.transport {
            return Err(LiveError::NoTransport);
        }
        let shared = self.shared();
        let exists = |nqn: &str| LiveError::ListenerExists {
            nqn: nqn.into(),
            addr,
        };
        if is_discovery(nqn) {
            if live
                .bound(addr)
                .is_some_and(|r| live.discovery.contains(&r))
            {
                return Err(exists(DISCOVERY_NQN));
            }
            let real = self.socket(&mut live, &shared, addr)?;
            live.discovery.push(real);
            shared.genctr.fetch_add(1, Relaxed);
            tracing::info!(nqn = DISCOVERY_NQN, listen = %real, "listener added to subsystem");
            return Ok(real);
        }
        let e = Self::entry(&shared, nqn)?;
        if live.bound(addr).is_some_and(|r| e.listeners.contains(&r)) {
            return Err(exists(nqn));
        }
        let real = self.socket(&mut live, &shared, addr)?;
        Self::change(&shared, nqn, |e| {
            e.listeners.push(real);
            e.ana_ports.push((
                real,
                Arc::new(pollux_controller::AnaPort::new(
                    pollux_spec::log::AnaState::Optimized,
                )),
            ));
            Ok(())
        })?;
        tracing::info!(nqn, listen = %real, "listener added to subsystem");
        Ok(real)
    }

    /// Stops serving `nqn` on `addr` (SPDK's
    /// `nvmf_subsystem_remove_listener`): its queues connected through it
    /// are closed (a controller whose admin queue came through it, with
    /// all its queues); the socket closes when no subsystem listens there.
    pub fn remove_listener(&self, nqn: &str, addr: SocketAddr) -> Result<(), LiveError> {
        let mut live = self.live();
        let shared = self.shared();
        let real = live.bound(addr).unwrap_or(addr);
        if is_discovery(nqn) {
            let before = live.discovery.len();
            live.discovery.retain(|a| *a != real);
            if live.discovery.len() == before {
                return Err(LiveError::NoListener {
                    nqn: DISCOVERY_NQN.into(),
                    addr,
                });
            }
            shared.genctr.fetch_add(1, Relaxed);
            let refs: Vec<ConnRef> = shared
                .table()
                .map
                .values()
                .filter(|c| c.subsys == SubsysId::Discovery && c.admin.listener == real)
                .map(|c| c.admin)
                .collect();
            let n = refs.len();
            self.close_conns(refs);
            tracing::info!(nqn = DISCOVERY_NQN, listen = %real, queues_closed = n, "listener removed from subsystem");
            return self.release_sockets(&mut live, &shared);
        }
        let e = Self::change(&shared, nqn, |e| {
            let before = e.listeners.len();
            e.listeners.retain(|a| *a != real);
            e.ana_ports.retain(|(a, _)| *a != real);
            if e.listeners.len() == before {
                return Err(LiveError::NoListener {
                    nqn: nqn.into(),
                    addr,
                });
            }
            Ok(())
        })?;
        let mut refs = Vec::new();
        for c in shared.table().map.values() {
            if c.subsys != SubsysId::Nvm(e.id) {
                continue;
            }
            let all = c.admin.listener == real;
            if all {
                refs.push(c.admin);
            }
            refs.extend(
                c.io.iter()
                    .filter(|(_, r)| all || r.listener == real)
                    .map(|(_, r)| *r),
            );
        }
        let n = refs.len();
        self.close_conns(refs);
        tracing::info!(nqn, listen = %real, queues_closed = n, "listener removed from subsystem");
        self.release_sockets(&mut live, &shared)
    }

    /// The subsystems as SPDK's `nvmf_get_subsystems` lists them: the
    /// discovery subsystem, then the NVM ones in creation order.
    pub fn subsystems(&self) -> Vec<Value> {
        let discovery: Vec<Value> = self.live().discovery.iter().map(address_json).collect();
        let shared = self.shared();
        let mut out = vec![json!({
            "nqn": DISCOVERY_NQN,
            "subtype": "Discovery",
            "listen_addresses": discovery,
            "allow_any_host": true,
            "hosts": [],
        })];
        for s in shared.subsystems().iter() {
            out.push(subsystem_json(s));
        }
        out
    }

    /// The controllers of `nqn` as SPDK's
    /// `nvmf_subsystem_get_controllers` lists them.
    pub fn subsystem_controllers(&self, nqn: &str) -> Result<Vec<Value>, LiveError> {
        let shared = self.shared();
        let id = self.subsys_id(&shared, nqn)?;
        let t = shared.table();
        let mut v: Vec<(u16, Value)> = t
            .map
            .iter()
            .filter(|(_, e)| e.subsys == id)
            .map(|(cntlid, e)| {
                let kind = if id == SubsysId::Discovery {
                    "discovery"
                } else {
                    "io"
                };
                (
                    *cntlid,
                    json!({
                        "cntlid": cntlid,
                        "cntrltype": kind,
                        "hostnqn": e.hostnqn,
                        "hostid": uuid_str(&e.hostid),
                        "num_io_qpairs": e.io.len(),
                    }),
                )
            })
            .collect();
        v.sort_by_key(|(c, _)| *c);
        Ok(v.into_iter().map(|(_, j)| j).collect())
    }

    /// The queue pairs of `nqn` as SPDK's `nvmf_subsystem_get_qpairs`
    /// lists them (connected queues: state "enabled").
    pub fn subsystem_qpairs(&self, nqn: &str) -> Result<Vec<Value>, LiveError> {
        let shared = self.shared();
        let id = self.subsys_id(&shared, nqn)?;
        let t = shared.table();
        let mut v: Vec<(u16, u16, Value)> = Vec::new();
        for (cntlid, e) in t.map.iter().filter(|(_, e)| e.subsys == id) {
            for (qid, r) in std::iter::once((0, &e.admin)).chain(e.io.iter().map(|(q, r)| (*q, r)))
            {
                v.push((
                    *cntlid,
                    qid,
                    json!({
                        "cntlid": cntlid,
                        "qid": qid,
                        "state": "enabled",
                        "thread": format!("nvmf_tgt_poll_group_{:03}", r.thread),
                        "hostnqn": e.hostnqn,
                        "listen_address": address_json(&r.listener),
                        "peer_address": address_json(&r.peer),
                    }),
                ));
            }
        }
        v.sort_by_key(|(c, q, _)| (*c, *q));
        Ok(v.into_iter().map(|(_, _, j)| j).collect())
    }

    fn subsys_id(&self, shared: &Shared, nqn: &str) -> Result<SubsysId, LiveError> {
        let subs = shared.subsystems();
        shared
            .find(&subs, nqn)
            .map(|(id, _)| id)
            .ok_or_else(|| LiveError::NoSubsystem { nqn: nqn.into() })
    }

    /// The nvmf part of SPDK's `save_config`: the `{"method", "params"}`
    /// entries that `pollux target -c` (or SPDK) reads back to the same
    /// transport, subsystems, namespaces, listeners and hosts. The
    /// discovery subsystem is not created (it always is), its own
    /// listeners are listed (as SPDK's).
    pub fn save_config_nvmf(&self) -> Vec<Value> {
        let (transport, discovery) = {
            let live = self.live();
            (live.transport, live.discovery.clone())
        };
        let shared = self.shared();
        let mut out = Vec::new();
        if shared.auth != AuthOptions::default() {
            out.push(self.save_config_set_config());
        }
        if transport {
            let p = shared.opts.create_transport_params();
            out.push(json!({"method": "nvmf_create_transport", "params": p}));
        }
        for a in &discovery {
            out.push(json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": DISCOVERY_NQN, "listen_address": address_json(a)}}));
        }
        for s in shared.subsystems().iter() {
            let nqn = s.model.nqn();
            let mut p = json!({
                "nqn": nqn,
                "allow_any_host": s.allow_any_host,
                "serial_number": s.model.serial(),
                "model_number": s.model.model_number(),
            });
            if s.max_namespaces != 0 {
                p["max_namespaces"] = s.max_namespaces.into();
            }
            if s.model.ana_reporting() {
                p["ana_reporting"] = true.into();
            }
            p["min_cntlid"] = s.cntlids.0.into();
            p["max_cntlid"] = s.cntlids.1.into();
            out.push(json!({"method": "nvmf_create_subsystem", "params": p}));
            for h in &s.hosts {
                let mut p = host_json(h, &s.host_keys);
                p["nqn"] = nqn.into();
                p["host"] = h.as_str().into();
                out.push(json!({"method": "nvmf_subsystem_add_host", "params": p}));
            }
            for ns in s.model.namespaces() {
                let mut n = json!({"bdev_name": ns.bdev_name, "nsid": ns.nsid});
                if let Some(u) = ns.uuid {
                    n["uuid"] = u.into();
                }
                if let Some(u) = ns.nguid {
                    n["nguid"] = u.into();
                }
                if let Some(u) = ns.eui64 {
                    n["eui64"] = u.into();
                }
                if s.model.ana_reporting() {
                    n["anagrpid"] = ns.anagrpid.into();
                }
                out.push(json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": n}}));
            }
            for a in &s.listeners {
                out.push(json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": nqn, "listen_address": address_json(a)}}));
                out.extend(save_ana_states(s, a, nqn));
            }
        }
        out
    }
}

/// One NVM subsystem as `nvmf_get_subsystems` lists it.
fn subsystem_json(s: &SubsysEntry) -> Value {
    let namespaces: Vec<Value> = s
        .model
        .namespaces()
        .into_iter()
        .map(|n| {
            let mut j = json!({"nsid": n.nsid, "bdev_name": n.bdev_name, "name": n.bdev_name});
            if let Some(u) = n.uuid {
                j["uuid"] = u.into();
            }
            if let Some(u) = n.nguid {
                j["nguid"] = u.into();
            }
            if let Some(u) = n.eui64 {
                j["eui64"] = u.into();
            }
            if s.model.ana_reporting() {
                j["anagrpid"] = n.anagrpid.into();
            }
            j
        })
        .collect();
    let mut j = json!({
        "nqn": s.model.nqn(),
        "subtype": "NVMe",
        "listen_addresses": s.listeners.iter().map(address_json).collect::<Vec<_>>(),
        "allow_any_host": s.allow_any_host,
        "hosts": s.hosts.iter().map(|h| {
            let mut j = host_json(h, &s.host_keys);
            j["nqn"] = h.as_str().into();
            j
        }).collect::<Vec<_>>(),
        "serial_number": s.model.serial(),
        "model_number": s.model.model_number(),
    });
    if s.max_namespaces != 0 {
        j["max_namespaces"] = s.max_namespaces.into();
    }
    j["min_cntlid"] = s.cntlids.0.into();
    j["max_cntlid"] = s.cntlids.1.into();
    if s.model.ana_reporting() {
        j["ana_reporting"] = true.into();
    }
    j["namespaces"] = namespaces.into();
    j
}

/// The `nvmf_subsystem_listener_set_ana_state` calls that give listener
/// `a` of `s` its ANA states again (none when all are optimized).
fn save_ana_states(s: &SubsysEntry, a: &SocketAddr, nqn: &str) -> Vec<Value> {
    let Some(port) = s.ana_port(*a).filter(|_| s.model.ana_reporting()) else {
        return Vec::new();
    };
    let (default, groups) = port.snapshot();
    let call = |g: Option<u32>, st: pollux_spec::log::AnaState| {
        let mut p = json!({"nqn": nqn, "listen_address": address_json(a), "ana_state": st.name()});
        if let Some(g) = g {
            p["anagrpid"] = g.into();
        }
        json!({"method": "nvmf_subsystem_listener_set_ana_state", "params": p})
    };
    let mut out = Vec::new();
    if default != pollux_spec::log::AnaState::Optimized {
        out.push(call(None, default));
    }
    out.extend(groups.into_iter().map(|(g, st)| call(Some(g), st)));
    out
}
