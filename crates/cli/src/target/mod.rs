//! `pollux target`: an NVMe/TCP target (pollux-nvmf) from quick flags
//! (one subsystem, one namespace — or every namespace of the `--nvme`
//! controller) or SPDK's JSON configuration (`-c`).
//!
//! Its NVMe bdevs (`--nvme`, `-c`'s `bdev_nvme_attach_controller`
//! entries) may be of any transport, side by side: PCIe devices, emulated
//! controllers, NVMe/TCP controllers (`crate::nvme_open`).

mod auth;
mod banner;
mod bdevs;
mod reload;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use pollux_bdev::config::NvmeAttach;
use pollux_bdev::{Bdev, UringOptions};
use pollux_nvmf::{
    check_cntlid_range, parse_uuid, AnaState, NamespaceConfig, NsIds, RuntimeOptions,
    SubsystemConfig, Target, TargetConfig, TransportOptions,
};

use crate::common::cores::online_cpus;
use crate::common::opts::{size_in_blocks, BadOption, CpumaskArgs, DeviceCoreArgs};
use crate::nvme_open::NvmeOpener;
use pollux_host::trid::parse_size;
use pollux_spec::fabrics::check_nqn;

#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// Listen address (IP:port), repeatable (quick mode; default
    /// 127.0.0.1:4420).
    #[arg(long = "listen")]
    pub listen: Vec<String>,
    /// A null namespace of this size (stores nothing).
    #[arg(long = "null")]
    pub null: Option<String>,
    /// A RAM namespace of this size.
    #[arg(long = "ram")]
    pub ram: Option<String>,
    /// A namespace on a file or block device through io_uring.
    #[arg(long = "uring")]
    pub uring: Option<String>,
    /// Every namespace of an NVMe controller.
    #[arg(long = "nvme", value_name = "TRID", help = concat!(
        "Every namespace of an NVMe controller. ",
        crate::common::opts::trid_help!()
    ))]
    pub nvme: Option<String>,
    #[command(flatten)]
    pub device: DeviceCoreArgs,
    /// Block size of --null and --ram.
    #[arg(long = "block-size", default_value_t = 512)]
    pub block_size: u32,
    /// Subsystem NQN (quick mode).
    #[arg(long = "nqn", default_value = "nqn.2016-06.io.pollux:cnode1")]
    pub nqn: String,
    /// The namespace's UUID (quick mode; also its NGUID): two targets
    /// exporting the same storage with the same UUID and NQN are one
    /// namespace with two paths to a host [default: derived from the
    /// serial number].
    #[arg(long = "ns-uuid", value_name = "UUID")]
    pub ns_uuid: Option<String>,
    /// The controller IDs the subsystem gives (quick mode), e.g. 1-99 on
    /// one target and 100-199 on another serving the same subsystem
    /// [default: 1-65519].
    #[arg(long = "cntlid-range", value_name = "MIN-MAX")]
    pub cntlid_range: Option<String>,
    /// ANA state of the --listen of the same rank, repeatable (quick
    /// mode): optimized, non_optimized or inaccessible; turns ANA
    /// reporting on (listeners without one: optimized).
    #[arg(long = "ana-state", value_name = "STATE")]
    pub ana_state: Vec<String>,
    /// A host NQN allowed to connect, repeatable (default: any host).
    #[arg(long = "host")]
    pub host: Vec<String>,
    #[command(flatten)]
    pub dhchap: auth::DhchapArgs,
    /// Serial number (quick mode).
    #[arg(long = "serial")]
    pub serial: Option<String>,
    /// Model number (quick mode).
    #[arg(long = "model")]
    pub model: Option<String>,
    #[command(flatten)]
    pub cpumask: CpumaskArgs,
    /// SPDK JSON configuration (bdev and nvmf subsystems). SIGHUP (or
    /// JSON-RPC pollux_reload_config) reloads it: listeners, their ANA
    /// states and hosts change live; what needs a restart is logged.
    #[arg(short = 'c', long = "config")]
    pub config: Option<String>,
    /// In-capsule data bytes of I/O capsules (-c: nvmf_create_transport's
    /// in_capsule_data_size) [default: 4096].
    #[arg(long = "in-capsule-data-size", value_name = "SIZE")]
    pub in_capsule_data_size: Option<String>,
    /// Entries of an I/O queue at most (-c: max_queue_depth) [default:
    /// 128].
    #[arg(long = "max-queue-depth", value_name = "N", value_parser = clap::value_parser!(u16).range(
        i64::from(*pollux_nvmf::config::QUEUE_DEPTHS.start())..=i64::from(*pollux_nvmf::config::QUEUE_DEPTHS.end())
    ))]
    pub max_queue_depth: Option<u16>,
    /// Largest transfer of one command, a power of two (-c: max_io_size)
    /// [default: 131072].
    #[arg(long = "max-io-size", value_name = "SIZE")]
    pub max_io_size: Option<String>,
    /// Place each connection on the thread whose core receives its
    /// packets (SO_INCOMING_CPU).
    #[arg(long = "incoming-cpu")]
    pub incoming_cpu: bool,
    /// Idle threads keep polling instead of sleeping in epoll.
    #[arg(long = "no-epoll-idle")]
    pub no_epoll_idle: bool,
    /// Copy large incoming data out of the receive buffer instead of
    /// receiving it straight into the command's buffer.
    #[arg(long = "no-direct-receive")]
    pub no_direct_receive: bool,
    /// posix: after an empty receive, read a connection again only once
    /// the thread's epoll reports its socket readable.
    #[arg(long = "epoll-receive")]
    pub epoll_receive: bool,
    /// Each connection's socket send buffer in bytes (SO_SNDBUF; 0: the
    /// kernel's, tuned as it goes). A fixed one keeps loopback's data in
    /// flight within the caches, and caps a connection at about this many
    /// bytes per network round trip [default: 0].
    #[arg(long = "send-buffer", value_name = "BYTES")]
    pub send_buffer: Option<u32>,
    /// Data buffers of the whole target, in units of io_unit_size (128 KiB
    /// unless -c sets it; -c: num_shared_buffers) [default: 511].
    #[arg(long = "num-shared-buffers", value_name = "N")]
    pub num_shared_buffers: Option<u32>,
    /// Socket implementation of the target's threads: posix (recv and
    /// sendmsg per connection, epoll when idle) or uring (one io_uring per
    /// thread: multishot receive into provided buffers, the sends of all
    /// connections in one io_uring_enter per poll) [default: posix].
    #[arg(long = "sock-impl", value_name = "IMPL", value_parser = ["posix", "uring"])]
    pub sock_impl: Option<String>,
    /// uring: do not register the sockets with the ring (fixed files).
    #[arg(long = "no-uring-fixed-files")]
    pub no_uring_fixed_files: bool,
    /// uring: provided receive buffers per thread, a power of two
    /// [default: 512].
    #[arg(long = "uring-rx-buffers", value_name = "N")]
    pub uring_rx_buffers: Option<u16>,
    /// uring: bytes of each provided receive buffer [default: 16384].
    #[arg(long = "uring-rx-buffer-size", value_name = "BYTES")]
    pub uring_rx_buffer_size: Option<u32>,
    /// uring: a connection's send of at least BYTES goes zero-copy
    /// (SENDMSG_ZC; the poll waits for the kernel's notification); 0: off
    /// [default: 0].
    #[arg(long = "uring-zcopy-threshold", value_name = "BYTES")]
    pub uring_zcopy_threshold: Option<u32>,
    /// uring: bytes of each thread's data buffers kept in one region
    /// registered with its ring, so a zero-copy send from them names the
    /// registered buffer and the kernel pins no pages per send (Linux
    /// 6.15+); 1MiB..=1GiB (e.g. 64MiB), only with
    /// --uring-zcopy-threshold; 0: off [default: 0].
    #[arg(long = "uring-registered-buffers", value_name = "BYTES")]
    pub uring_registered_buffers: Option<String>,
    /// Most iovecs in one sendmsg, 1..=512 (512: a full queue's responses
    /// in one call) [default: 512].
    #[arg(long = "send-iov", value_name = "N")]
    pub send_iov: Option<usize>,
    /// SO_BUSY_POLL microseconds on each connection's socket (-c:
    /// busy_poll_us; 0: off). Loopback has no NAPI id: no effect there.
    #[arg(long = "busy-poll", value_name = "US")]
    pub busy_poll: Option<u32>,
    /// Microseconds a target thread keeps polling with nothing to do
    /// before it sleeps in epoll (the spin before sleeping: at queue depth
    /// 1 the next command comes well within it, so the thread is not
    /// woken per command) [default: 200].
    #[arg(long = "idle-spin", value_name = "US",
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub idle_spin: Option<u32>,
    #[command(flatten)]
    pub rpc: crate::rpc::RpcArgs,
    #[command(flatten)]
    pub metrics: crate::metrics::MetricsArgs,
    /// Seconds a connection may take to send its ICReq, and then to get
    /// its queue connected (Fabrics Connect), before it is closed
    /// (decimals allowed, up to 3600) [default: 10].
    #[arg(long = "handshake-timeout", value_name = "SECS")]
    pub handshake_timeout: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetCliError {
    #[error(transparent)]
    Bad(#[from] BadOption),
    #[error(transparent)]
    Target(#[from] pollux_nvmf::TargetError),
    #[error(transparent)]
    Config(#[from] pollux_nvmf::ConfigError),
    /// An NVMe controller could not be opened.
    #[error("{what}: {why}")]
    Nvme { what: String, why: String },
    /// The JSON-RPC socket could not be served.
    #[error(transparent)]
    Rpc(#[from] pollux_rpc::ServeError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// The SIGHUP (reload) watcher could not start.
    #[error("watching for SIGHUP (configuration reload): {0}")]
    Hangup(#[source] std::io::Error),
    /// A listener could not be bound: a refusal, with what to do.
    #[error("cannot listen on {addr}: {why}")]
    Listen { addr: SocketAddr, why: String },
}

/// A listener that could not be bound, said as a refusal with what to
/// do (`config`: the listeners come from `-c`'s file, not `--listen`).
fn listen_refused(addr: SocketAddr, e: &std::io::Error, config: bool) -> TargetCliError {
    use std::io::ErrorKind;
    let port = if config {
        "choose another trsvcid in the configuration's nvmf_subsystem_add_listener"
    } else {
        "choose another --listen port"
    };
    let why = match e.kind() {
        ErrorKind::AddrInUse => {
            format!("address already in use (another target running? {port})")
        }
        ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this machine (give one of its addresses, or 0.0.0.0 for all)",
            addr.ip()
        ),
        ErrorKind::PermissionDenied => {
            format!("permission denied (ports below 1024 need root; {port})")
        }
        _ => e.to_string(),
    };
    TargetCliError::Listen { addr, why }
}

fn bad(
    option: &'static str,
    value: impl std::fmt::Display,
    why: impl Into<String>,
) -> TargetCliError {
    BadOption::new(option, value, why).into()
}

/// `--handshake-timeout SECS`: decimal seconds, 1 ms..=1 hour.
fn handshake_timeout(v: &str) -> Result<Duration, TargetCliError> {
    let max = pollux_nvmf::config::MAX_HANDSHAKE_TIMEOUT;
    let why = format!(
        "expected seconds (decimals allowed) from 0.001 to {}",
        max.as_secs()
    );
    let secs: f64 = v
        .trim()
        .parse()
        .map_err(|_| bad("--handshake-timeout", v, why.clone()))?;
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d >= Duration::from_millis(1) && d <= max => Ok(d),
        _ => Err(bad("--handshake-timeout", v, why)),
    }
}

fn size_opt(option: &'static str, v: &Option<String>) -> Result<Option<u64>, TargetCliError> {
    v.as_ref()
        .map(|s| parse_size(s).map_err(|e| bad(option, s, e)))
        .transpose()
}

/// The configuration the options describe (creates the bdevs): `nvme`
/// opens `--nvme`'s controller, `attach` those of `-c`.
pub fn config(
    a: &TargetArgs,
    nvme: &mut impl FnMut(&str) -> Result<Vec<Bdev>, TargetCliError>,
    attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, String>,
) -> Result<TargetConfig, TargetCliError> {
    let quick = a.null.is_some() || a.ram.is_some() || a.uring.is_some() || a.nvme.is_some();
    let mut cfg = if let Some(path) = &a.config {
        if quick
            || !a.listen.is_empty()
            || !a.host.is_empty()
            || multipath_flags(a)
            || a.dhchap.any_key()
        {
            return Err(bad(
                "-c",
                path,
                "the JSON configuration defines subsystems, namespaces, listeners and hosts: not with --null/--ram/--uring/--nvme/--listen/--host/--ns-uuid/--cntlid-range/--ana-state/--dhchap-key",
            ));
        }
        let json = std::fs::read_to_string(path).map_err(|e| bad("-c", path, e.to_string()))?;
        TargetConfig::from_json_with(&json, attach).map_err(|e| bad("-c", path, e.to_string()))?
    } else {
        let given = [&a.null, &a.ram, &a.uring, &a.nvme]
            .iter()
            .filter(|o| o.is_some())
            .count();
        if given == 0 {
            if !a.listen.is_empty()
                || !a.host.is_empty()
                || multipath_flags(a)
                || a.dhchap.any_key()
            {
                return Err(bad(
                    if !a.listen.is_empty() || !a.host.is_empty() {
                        "--listen/--host"
                    } else {
                        "--ns-uuid/--cntlid-range/--ana-state"
                    },
                    "",
                    "quick mode needs a namespace (--null/--ram/--uring/--nvme); without one the target starts empty, configured over JSON-RPC (-r)",
                ));
            }
            // As SPDK's nvmf_tgt: no subsystems yet, configured live over
            // JSON-RPC.
            TargetConfig::default()
        } else {
            quick_config(a, given, nvme)?
        }
    };
    a.dhchap.apply_options(&mut cfg)?;

    let t: &mut TransportOptions = &mut cfg.transport;
    if let Some(v) = size_opt("--in-capsule-data-size", &a.in_capsule_data_size)? {
        t.in_capsule_data_size =
            u32::try_from(v).map_err(|_| bad("--in-capsule-data-size", v, "too large"))?;
    }
    if let Some(v) = a.max_queue_depth {
        t.max_queue_depth = v;
    }
    if let Some(v) = size_opt("--max-io-size", &a.max_io_size)? {
        t.max_io_size = u32::try_from(v).map_err(|_| bad("--max-io-size", v, "too large"))?;
    }
    if let Some(v) = &a.handshake_timeout {
        let d = handshake_timeout(v)?;
        t.icreq_timeout = d;
        t.connect_timeout = d;
    }
    if let Some(n) = a.num_shared_buffers {
        t.num_shared_buffers = n;
    }
    // A switch given overrides the file; not given, the file's value
    // (or the default) stays.
    if a.incoming_cpu {
        t.incoming_cpu = true;
    }
    if a.no_epoll_idle {
        t.epoll_idle = false;
    }
    if a.no_direct_receive {
        t.direct_receive = false;
    }
    if a.epoll_receive {
        t.epoll_receive = true;
    }
    if let Some(n) = a.send_buffer {
        t.send_buffer = n;
    }
    if let Some(n) = a.send_iov {
        t.send_iov = n;
    }
    if let Some(us) = a.busy_poll {
        t.busy_poll_us = us;
    }
    if let Some(v) = &a.sock_impl {
        t.sock_impl = pollux_nvmf::SockImpl::from_name(v).unwrap_or_default();
    }
    if a.no_uring_fixed_files {
        t.uring_fixed_files = false;
    }
    if let Some(n) = a.uring_rx_buffers {
        t.uring_rx_buffers = n;
    }
    if let Some(n) = a.uring_rx_buffer_size {
        t.uring_rx_buffer_size = n;
    }
    if let Some(n) = a.uring_zcopy_threshold {
        t.uring_zcopy_threshold = n;
    }
    let regbuf = "--uring-registered-buffers";
    if let Some(v) = size_opt(regbuf, &a.uring_registered_buffers)? {
        t.uring_registered_buffers =
            u32::try_from(v).map_err(|_| bad(regbuf, v, "must be 0 (off) or 1 MiB..=1 GiB"))?;
    }
    cfg.validate().map_err(|e| match e {
        pollux_nvmf::ConfigError::Transport { option, value, why } => bad(
            match option {
                "in_capsule_data_size" => "--in-capsule-data-size",
                "max_queue_depth" => "--max-queue-depth",
                "max_io_size" => "--max-io-size",
                "send_iov" => "--send-iov",
                "send_buffer" => "--send-buffer",
                "busy_poll_us" => "--busy-poll",
                "uring_rx_buffers" => "--uring-rx-buffers",
                "uring_rx_buffer_size" => "--uring-rx-buffer-size",
                "uring_zcopy_threshold" => "--uring-zcopy-threshold",
                "uring_registered_buffers" => "--uring-registered-buffers",
                other => other,
            },
            value,
            // (The option it needs, by its flag.)
            why.replace("set uring_zcopy_threshold", "set --uring-zcopy-threshold"),
        ),
        pollux_nvmf::ConfigError::Subsystem { nqn, why } if a.config.is_none() => {
            bad("--nqn/--host", nqn, why)
        }
        other => TargetCliError::Config(other),
    })?;
    Ok(cfg)
}

/// Quick mode's configuration: one subsystem serving the one namespace
/// of `--null/--ram/--uring/--nvme` (`given` of them were given).
fn quick_config(
    a: &TargetArgs,
    given: usize,
    nvme: &mut impl FnMut(&str) -> Result<Vec<Bdev>, TargetCliError>,
) -> Result<TargetConfig, TargetCliError> {
    let mut cfg = TargetConfig::default();
    if given > 1 {
        return Err(bad(
            "--null/--ram/--uring/--nvme",
            "",
            "quick mode serves one namespace: give only one of them (or -c FILE)",
        ));
    }
    let bs = a.block_size;
    let local = |option: &'static str, v: &String, ram: bool| -> Result<Bdev, TargetCliError> {
        let size = parse_size(v).map_err(|e| bad(option, v, e))?;
        let blocks = size_in_blocks(size, bs, "--block-size").map_err(|e| bad(option, v, e))?;
        let r = if ram {
            Bdev::ram("Malloc0", bs, blocks)
        } else {
            Bdev::null("Null0", bs, blocks)
        };
        r.map_err(|e| bad(option, v, e.to_string()))
    };
    let bdevs = if let Some(v) = &a.null {
        vec![local("--null", v, false)?]
    } else if let Some(v) = &a.ram {
        vec![local("--ram", v, true)?]
    } else if let Some(t) = &a.nvme {
        nvme(t)?
    } else if let Some(p) = &a.uring {
        let o = UringOptions {
            direct: true,
            wake_fd: true,
            ..Default::default()
        };
        vec![Bdev::uring("Uring0", p, o.clone())
            .or_else(|_| Bdev::uring("Uring0", p, UringOptions { direct: false, ..o }))
            .map_err(|e| bad("--uring", p, e.to_string()))?]
    } else {
        return Err(bad("--null/--ram/--uring/--nvme", "", "give one namespace"));
    };
    check_nqn(&a.nqn).map_err(|e| bad("--nqn", &a.nqn, e.to_string()))?;
    for h in &a.host {
        check_nqn(h).map_err(|e| bad("--host", h, e.to_string()))?;
    }
    let mut s = SubsystemConfig::new(&a.nqn);
    s.serial = a.serial.clone();
    s.model = a.model.clone();
    s.allow_any_host = a.host.is_empty();
    s.hosts = a.host.clone();
    let mut ids = NsIds::default();
    if let Some(u) = &a.ns_uuid {
        ids.uuid =
            Some(parse_uuid(u).ok_or_else(|| {
                bad("--ns-uuid", u, "not a UUID (8-4-4-4-12 hexadecimal digits)")
            })?);
        if bdevs.len() > 1 {
            return Err(bad(
                "--ns-uuid",
                u,
                format!(
                    "one UUID for {} namespaces: use -c with one uuid per nvmf_subsystem_add_ns",
                    bdevs.len()
                ),
            ));
        }
    }
    s.namespaces.extend(bdevs.iter().map(|b| NamespaceConfig {
        bdev: b.name().to_string(),
        nsid: None,
        ids,
        ..Default::default()
    }));
    if let Some(r) = &a.cntlid_range {
        let why = "MIN-MAX, 1 <= MIN <= MAX <= 65519";
        let (lo, hi) = r
            .split_once('-')
            .ok_or_else(|| bad("--cntlid-range", r, why))?;
        let (lo, hi) = match (lo.trim().parse::<u16>(), hi.trim().parse::<u16>()) {
            (Ok(l), Ok(h)) => (l, h),
            _ => return Err(bad("--cntlid-range", r, why)),
        };
        check_cntlid_range(lo, hi).map_err(|e| bad("--cntlid-range", r, e))?;
        (s.min_cntlid, s.max_cntlid) = (lo, hi);
    }
    let listen = if a.listen.is_empty() {
        vec!["127.0.0.1:4420".to_string()]
    } else {
        a.listen.clone()
    };
    if a.ana_state.len() > listen.len() {
        return Err(bad(
            "--ana-state",
            &a.ana_state[listen.len()],
            format!(
                "{} --ana-state for {} --listen: one per --listen, in order",
                a.ana_state.len(),
                listen.len()
            ),
        ));
    }
    for (k, l) in listen.iter().enumerate() {
        let addr: SocketAddr = l
            .parse()
            .map_err(|_| bad("--listen", l, "not an IP:port address"))?;
        s.listeners.push(addr);
        if let Some(v) = a.ana_state.get(k) {
            let st = match AnaState::from_name(v) {
                Some(
                    st @ (AnaState::Optimized | AnaState::NonOptimized | AnaState::Inaccessible),
                ) => st,
                _ => {
                    return Err(bad(
                        "--ana-state",
                        v,
                        "optimized, non_optimized or inaccessible",
                    ))
                }
            };
            s.ana_states.push((addr, None, st));
        }
    }
    s.ana_reporting = !a.ana_state.is_empty();
    a.dhchap.apply_keys(&mut cfg, &mut s)?;
    cfg.bdevs.extend(bdevs);
    cfg.subsystems.push(s);
    Ok(cfg)
}

/// Any of the quick mode's multipath flags was given.
fn multipath_flags(a: &TargetArgs) -> bool {
    a.ns_uuid.is_some() || a.cntlid_range.is_some() || !a.ana_state.is_empty()
}

/// Runs until SIGINT/SIGTERM.
pub fn run(a: TargetArgs) -> Result<(), TargetCliError> {
    let online = online_cpus();
    let cores = a.cpumask.cores(&online)?;
    a.device.check(&online)?;
    let device_core = a.device.core(&cores, &online);
    // A socket in use is refused before the slow start-up.
    crate::rpc::check_socket(&a.rpc.rpc_socket)?;
    // NVMe controllers of any transport, side by side; opened as the
    // configuration names them (and later by bdev_nvme_attach_controller).
    let opener = std::cell::RefCell::new(NvmeOpener::new(
        false,
        device_core,
        1,
        pollux_host::QpairOptions::default(),
    ));
    let cfg = config(
        &a,
        &mut |t: &str| {
            opener
                .borrow_mut()
                .open_trid("Nvme0", t)
                .map_err(|e| TargetCliError::Nvme {
                    what: e.what,
                    why: e.why,
                })
        },
        // (The config's error names the controller: only why here.)
        &mut |att: &NvmeAttach| opener.borrow_mut().attach(att).map_err(|e| e.why),
    );
    let opener = Arc::new(Mutex::new(opener.into_inner()));
    let r = cfg.and_then(|cfg| {
        let json = match &a.config {
            Some(p) => std::fs::read_to_string(p).ok(),
            None => None,
        };
        let registry =
            bdevs::registry(a.uring.as_deref(), a.nvme.as_deref(), &cfg, json.as_deref())
                .map_err(|e| bad("--null/--ram/--uring/--nvme/-c", "", e.to_string()))?;
        let app = crate::rpc::App::new(Arc::new(registry), Some(opener.clone()));
        serve(cfg, &cores, json.as_deref(), &app, &a)
    });
    // The controllers close after the target's bdevs and channels, the
    // device thread last (the opener's field order).
    drop(opener);
    r
}

/// Starts the target and its JSON-RPC server, prints its addresses and
/// what it serves (its subsystems, their namespaces, listeners and hosts,
/// its cores, the RPC socket), and runs until SIGINT/SIGTERM; SIGHUP
/// reloads `-c`'s file (`json`: its text at start).
fn serve(
    cfg: TargetConfig,
    cores: &[usize],
    json: Option<&str>,
    app: &crate::rpc::App,
    a: &TargetArgs,
) -> Result<(), TargetCliError> {
    let config = a.config.is_some();
    let rpc = &a.rpc;
    let subs = banner::subsystems(&cfg);
    let mut rt = RuntimeOptions {
        thread_name: "pollux-tgt".into(),
        ..Default::default()
    };
    if let Some(us) = a.idle_spin {
        rt.idle_threshold = std::time::Duration::from_micros(us.into());
    }
    let target = Arc::new(Target::start(cfg, cores, rt).map_err(|e| match e {
        pollux_nvmf::TargetError::Listen { addr, source } => listen_refused(addr, &source, config),
        e => e.into(),
    })?);
    let _signals = target.stop_on_signals()?;
    app.set_runtime(target.clone());
    let mut methods = crate::rpc::methods(app);
    crate::rpc::nvmf::register(&mut methods, target.clone(), app.registry.clone());
    let reloader = Arc::new(reload::Reloader::new(
        target.clone(),
        a.config.as_deref(),
        json,
    ));
    let _hangup = reload::HangupWatcher::start(reloader.clone()).map_err(TargetCliError::Hangup)?;
    let r = reloader.clone();
    // pollux's own (SPDK has no reload): the reload SIGHUP makes.
    methods.add("pollux_reload_config", move |p| {
        if p.is_some_and(|p| p.as_object().is_none_or(|o| !o.is_empty())) {
            return Err(pollux_rpc::RpcError::invalid_params(
                "pollux_reload_config takes no parameters",
            ));
        }
        match r.reload() {
            Ok(report) => Ok(report.to_json()),
            Err(e) => Err(pollux_rpc::RpcError::invalid_params(e.to_string())),
        }
    });
    let t = target.clone();
    app.add_save_config("keyring", Box::new(move || t.save_config_keyring()));
    let t = target.clone();
    app.add_save_config("nvmf", Box::new(move || t.save_config_nvmf()));
    let server = crate::rpc::serve(rpc, methods)?;
    let t = target.clone();
    let extra: crate::metrics::Extra = Box::new(move |e| target_samples(e, &t));
    let metrics = crate::metrics::start(&a.metrics, app, Some(extra))?;
    {
        let mut out = std::io::stdout().lock();
        // (The first line is the first address: scripts read it.)
        for addr in target.listen_addrs() {
            let _ = writeln!(out, "pollux target: listening on {addr}");
        }
        if subs.is_empty() {
            let _ = writeln!(
                out,
                "pollux target: no subsystems yet (configure it over JSON-RPC)"
            );
        }
        for l in banner::lines(&subs, &target.subsystem_listeners(), cores) {
            let _ = writeln!(out, "pollux target: {l}");
        }
        if let Some(m) = &metrics {
            let _ = writeln!(out, "pollux target: metrics on http://{}/metrics", m.addr());
        }
        let _ = writeln!(
            out,
            "pollux target: JSON-RPC on {} (spdk-rpc -s {} METHOD)",
            rpc.rpc_socket.display(),
            rpc.rpc_socket.display()
        );
        let _ = out.flush();
    }
    let r = target.wait();
    // The handlers (and what they hold of the target) go first.
    drop(metrics);
    drop(server);
    r?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "pollux target: stopped");
    Ok(())
}

/// The target's own gauges for `--metrics`.
fn target_samples(e: &mut crate::metrics::Exposition, t: &Target) {
    use crate::metrics::gauge;
    let (used, limit) = t.buffer_bytes();
    gauge(
        e,
        "pollux_target_connections",
        "NVMe/TCP connections open.",
        t.connections() as f64,
    );
    gauge(
        e,
        "pollux_target_controllers",
        "Controllers (host associations) alive.",
        t.controllers() as f64,
    );
    gauge(
        e,
        "pollux_target_buffer_bytes",
        "Bytes of data buffers alive.",
        used as f64,
    );
    gauge(
        e,
        "pollux_target_buffer_limit_bytes",
        "The data buffer pool's limit.",
        limit as f64,
    );
    // Each controller's I/O queue pairs (nvmf_subsystem_get_controllers).
    let mut f = e.family(
        "pollux_target_io_qpairs",
        crate::metrics::Kind::Gauge,
        "I/O queue pairs connected, per controller.",
    );
    for s in t.subsystems() {
        let Some(nqn) = s["nqn"].as_str() else {
            continue;
        };
        for c in t.subsystem_controllers(nqn).unwrap_or_default() {
            let cntlid = c["cntlid"].to_string();
            let host = c["hostnqn"].as_str().unwrap_or("");
            let n = c["num_io_qpairs"].as_f64().unwrap_or(0.0);
            f.sample(
                &[("subnqn", nqn), ("cntlid", &cntlid), ("hostnqn", host)],
                n,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::{json, Value};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: TargetArgs,
    }

    fn cfg(extra: &[&str]) -> Result<TargetConfig, TargetCliError> {
        let mut argv = vec!["target", "--ram", "1MiB", "--listen", "127.0.0.1:0"];
        argv.extend_from_slice(extra);
        let m = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(argv)
            .expect("arguments");
        let mut a = <Cli as clap::FromArgMatches>::from_arg_matches(&m)
            .expect("arguments")
            .a;
        a.dhchap.record_order(&m);
        config(
            &a,
            &mut |t: &str| Err(bad("--nvme", t, "none")),
            &mut |n: &NvmeAttach| Err(n.name.clone()),
        )
    }

    /// An option refused without a value reads `option: why`, as in
    /// perf and bdevperf (before: `option : why`).
    #[test]
    fn a_refusal_without_a_value_has_no_stray_space() {
        let a = Cli::try_parse_from(["target", "--null", "1MiB", "--ram", "1MiB"])
            .expect("arguments")
            .a;
        let e = config(
            &a,
            &mut |t: &str| Err(bad("--nvme", t, "none")),
            &mut |n: &NvmeAttach| Err(n.name.clone()),
        )
        .expect_err("two namespaces");
        assert_eq!(
            e.to_string(),
            "--null/--ram/--uring/--nvme: quick mode serves one namespace: give only one of them (or -c FILE)"
        );
    }

    /// Without a namespace the target starts empty, as SPDK's nvmf_tgt,
    /// to be configured over JSON-RPC (before: refused, "give one
    /// namespace"); --listen/--host without one are refused.
    #[test]
    fn no_namespace_is_an_empty_target() {
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).expect("arguments").a;
        let none = |a: &TargetArgs| {
            config(
                a,
                &mut |t: &str| Err(bad("--nvme", t, "none")),
                &mut |n: &NvmeAttach| Err(n.name.clone()),
            )
        };
        let cfg = none(&parse(&["target"])).expect("empty target");
        assert!(cfg.subsystems.is_empty() && cfg.bdevs.is_empty());
        let a = parse(&["target"]);
        assert_eq!(
            a.rpc.rpc_socket,
            std::path::PathBuf::from(crate::rpc::DEFAULT_SOCKET)
        );
        let a = parse(&["target", "-r", "/tmp/x.sock"]);
        assert_eq!(a.rpc.rpc_socket, std::path::PathBuf::from("/tmp/x.sock"));
        let e = none(&parse(&["target", "--listen", "127.0.0.1:0"]))
            .expect_err("--listen without a namespace");
        assert!(e.to_string().starts_with("--listen/--host: "), "{e}");
    }

    #[test]
    fn multipath_quick_flags() {
        let u = "6b1e0a51-2c4d-4e8f-9a01-112233445566";
        let c = cfg(&[
            "--ns-uuid",
            u,
            "--cntlid-range",
            "100-199",
            "--listen",
            "127.0.0.2:0",
            "--ana-state",
            "optimized",
            "--ana-state",
            "inaccessible",
        ])
        .expect("multipath flags");
        let s = &c.subsystems[0];
        assert_eq!(s.namespaces[0].ids.uuid, pollux_nvmf::parse_uuid(u));
        assert_eq!((s.min_cntlid, s.max_cntlid), (100, 199));
        assert!(s.ana_reporting);
        assert_eq!(
            s.ana_states
                .iter()
                .map(|(l, g, st)| (l.to_string(), *g, *st))
                .collect::<Vec<_>>(),
            [
                ("127.0.0.1:0".to_string(), None, AnaState::Optimized),
                ("127.0.0.2:0".to_string(), None, AnaState::Inaccessible)
            ]
        );
        let plain = cfg(&[]).expect("default");
        assert!(!plain.subsystems[0].ana_reporting);
        assert_eq!(
            (
                plain.subsystems[0].min_cntlid,
                plain.subsystems[0].max_cntlid
            ),
            (1, 0xFFEF)
        );
        for (argv, start) in [
            (&["--ns-uuid", "1234"][..], "--ns-uuid 1234: "),
            (&["--cntlid-range", "5"][..], "--cntlid-range 5: "),
            (
                &["--cntlid-range", "200-100"][..],
                "--cntlid-range 200-100: ",
            ),
            (&["--cntlid-range", "0-9"][..], "--cntlid-range 0-9: "),
            (&["--ana-state", "bogus"][..], "--ana-state bogus: "),
            (
                &["--ana-state", "persistent_loss"][..],
                "--ana-state persistent_loss: ",
            ),
            (
                &["--ana-state", "optimized", "--ana-state", "optimized"][..],
                "--ana-state optimized: 2 --ana-state for 1 --listen",
            ),
        ] {
            let e = cfg(argv).expect_err("refused").to_string();
            assert!(e.starts_with(start), "{argv:?}: {e}");
        }
    }

    #[test]
    fn handshake_timeout_sets_both_stages() {
        let d = cfg(&[]).expect("default").transport;
        assert_eq!(
            (d.icreq_timeout, d.connect_timeout),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
        let t = cfg(&["--handshake-timeout", "0.25"])
            .expect("0.25")
            .transport;
        assert_eq!(t.icreq_timeout, Duration::from_millis(250));
        assert_eq!(t.connect_timeout, Duration::from_millis(250));
        let t = cfg(&["--handshake-timeout", "30"]).expect("30").transport;
        assert_eq!(t.connect_timeout, Duration::from_secs(30));
        for v in ["0", "0.0001", "-1", "3601", "inf", "NaN", "ten", ""] {
            let e = cfg(&[&format!("--handshake-timeout={v}")])
                .err()
                .unwrap_or_else(|| panic!("{v:?} accepted"))
                .to_string();
            assert!(e.contains("--handshake-timeout"), "{v:?}: {e}");
        }
    }

    /// The defaults the transport options' help states are the target's
    /// own (`TransportOptions::default()`): they are written into the help
    /// text because the options override `-c`'s values only when given.
    #[test]
    fn the_help_states_the_transports_defaults() {
        use clap::CommandFactory;
        let d = TransportOptions::default();
        let cmd = Cli::command();
        let stated = |long: &str| -> String {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(long))
                .unwrap_or_else(|| panic!("--{long}"));
            let help = arg.get_help().expect("help").to_string();
            let (_, d) = help.split_once("[default: ").expect(long);
            d.trim_end_matches(['.', ']']).to_string()
        };
        assert_eq!(
            stated("in-capsule-data-size"),
            d.in_capsule_data_size.to_string()
        );
        assert_eq!(stated("max-queue-depth"), d.max_queue_depth.to_string());
        assert_eq!(stated("max-io-size"), d.max_io_size.to_string());
        assert_eq!(
            stated("num-shared-buffers"),
            d.num_shared_buffers.to_string()
        );
        assert_eq!(stated("send-iov"), d.send_iov.to_string());
        assert_eq!(stated("send-buffer"), d.send_buffer.to_string());
        assert_eq!(stated("sock-impl"), d.sock_impl.name());
        assert_eq!(stated("uring-rx-buffers"), d.uring_rx_buffers.to_string());
        assert_eq!(
            stated("uring-rx-buffer-size"),
            d.uring_rx_buffer_size.to_string()
        );
        assert_eq!(
            stated("uring-zcopy-threshold"),
            d.uring_zcopy_threshold.to_string()
        );
        assert_eq!(
            stated("uring-registered-buffers"),
            d.uring_registered_buffers.to_string()
        );
        assert_eq!(
            stated("handshake-timeout"),
            d.icreq_timeout.as_secs().to_string()
        );
        assert_eq!(d.icreq_timeout, d.connect_timeout);
    }

    /// The configuration of `-c` a file holding `json` and the flags
    /// `extra`.
    fn try_cfg_file(
        name: &str,
        json: &Value,
        extra: &[&str],
    ) -> Result<TargetConfig, TargetCliError> {
        let dir = std::env::temp_dir().join(format!("pollux-cli-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, json.to_string()).unwrap();
        let path = path.display().to_string();
        let mut argv = vec!["target", "-c", &path];
        argv.extend_from_slice(extra);
        let a = Cli::try_parse_from(argv).expect("arguments").a;
        config(
            &a,
            &mut |t: &str| Err(bad("--nvme", t, "none")),
            &mut |n: &NvmeAttach| Err(n.name.clone()),
        )
    }

    fn cfg_file(name: &str, json: &Value, extra: &[&str]) -> TargetConfig {
        try_cfg_file(name, json, extra).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
    }

    /// SPDK's configuration of a uring listener (its `save_config` writes
    /// the listener's `sock_impl`; its transport has none) starts a
    /// target given `--sock-impl uring`, and without it is refused naming
    /// the key and both implementations (before: refused as an unknown
    /// parameter either way).
    #[test]
    fn an_spdk_uring_listener_needs_the_targets_sock_impl() {
        let doc = json!({"subsystems": [{"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1"}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
                "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"},
                "secure_channel": false, "sock_impl": "uring"}}]}]});
        let c = cfg_file("uring-listener.json", &doc, &["--sock-impl", "uring"]);
        assert_eq!(c.transport.sock_impl, pollux_nvmf::SockImpl::Uring);
        let e = try_cfg_file("uring-listener.json", &doc, &[])
            .expect_err("posix target, uring listener")
            .to_string();
        assert!(
            e.contains("parameter 'sock_impl' is 'uring'")
                && e.contains("the transport's sock_impl is 'posix'")
                && e.contains("--sock-impl"),
            "{e}"
        );
    }

    /// A transport option set by both `-c`'s file and a flag takes the
    /// flag's value; set by the file alone, the file's (before: the
    /// switches --incoming-cpu, --no-epoll-idle and --no-direct-receive
    /// not given reset the file's incoming_cpu, epoll_idle and
    /// direct_receive to the defaults).
    #[test]
    fn a_flag_given_overrides_the_files_transport_option_and_only_then() {
        let file = |params: Value| {
            json!({"subsystems": [{"subsystem": "nvmf", "config": [
                {"method": "nvmf_create_transport", "params": params}]}]})
        };
        let d = TransportOptions::default();
        let set = file(
            json!({"trtype": "TCP", "incoming_cpu": true, "epoll_idle": false,
            "direct_receive": false, "max_queue_depth": 64, "sock_impl": "uring",
            "uring_rx_buffers": 1024, "send_iov": 8}),
        );
        let t = cfg_file("set.json", &set, &[]).transport;
        assert_eq!(
            (t.incoming_cpu, t.epoll_idle, t.direct_receive),
            (true, false, false),
            "the file's switches without flags"
        );
        assert_eq!(
            (
                t.max_queue_depth,
                t.sock_impl,
                t.uring_rx_buffers,
                t.send_iov
            ),
            (64, pollux_nvmf::SockImpl::Uring, 1024, 8)
        );
        let t = cfg_file(
            "set.json",
            &set,
            &[
                "--max-queue-depth",
                "32",
                "--sock-impl",
                "posix",
                "--uring-rx-buffers",
                "256",
                "--send-iov",
                "4",
            ],
        )
        .transport;
        assert_eq!(
            (
                t.max_queue_depth,
                t.sock_impl,
                t.uring_rx_buffers,
                t.send_iov
            ),
            (32, pollux_nvmf::SockImpl::Posix, 256, 4),
            "the flags over the file"
        );
        assert_eq!(
            (t.incoming_cpu, t.epoll_idle, t.direct_receive),
            (true, false, false)
        );
        let plain = file(json!({"trtype": "TCP"}));
        let t = cfg_file("plain.json", &plain, &[]).transport;
        assert_eq!(t, d);
        let t = cfg_file(
            "plain.json",
            &plain,
            &["--incoming-cpu", "--no-epoll-idle", "--no-direct-receive"],
        )
        .transport;
        assert_eq!(
            (t.incoming_cpu, t.epoll_idle, t.direct_receive),
            (true, false, false),
            "the switches over the file's defaults"
        );
        // A size flag: the file's without it, the flag's (in units) with it.
        let regbuf = file(
            json!({"trtype": "TCP", "uring_zcopy_threshold": 4096, "uring_registered_buffers": 1048576}),
        );
        for (extra, want) in [
            (&[][..], 1 << 20),
            (&["--uring-registered-buffers", "64MiB"][..], 64 << 20),
            (&["--uring-registered-buffers", "0"][..], 0),
        ] {
            let t = cfg_file("regbuf.json", &regbuf, extra).transport;
            assert_eq!(t.uring_registered_buffers, want, "{extra:?}");
            assert_eq!(t.uring_zcopy_threshold, 4096);
        }
    }

    /// A key file of mode `mode` holding `text`, in this test's directory.
    fn key_file(name: &str, text: &str, mode: u32) -> String {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pollux-cli-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    }

    const K0: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n";
    const K1: &str = "DHHC-1:01:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOeXryU:\n";
    const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1";
    const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a2";

    /// `--dhchap-key` and `--dhchap-ctrl-key` go to the `--host` before
    /// them; the keyring gets `key<N>`/`ckey<N>`.
    #[test]
    fn dhchap_keys_go_to_the_host_before_them() {
        let (k0, k1) = (key_file("k0", K0, 0o600), key_file("k1", K1, 0o600));
        let c = cfg(&[
            "--host",
            H1,
            "--dhchap-key",
            &k0,
            "--host",
            H2,
            "--dhchap-key",
            &k1,
            "--dhchap-ctrl-key",
            &k0,
            "--dhchap-digests",
            "sha512",
            "--dhchap-dhgroups",
            "ffdhe2048,null",
            "--dhchap-dh-threads",
            "2",
        ])
        .unwrap();
        let s = &c.subsystems[0];
        assert_eq!(s.hosts, [H1, H2]);
        assert_eq!(s.host_keys.len(), 2);
        assert_eq!(
            (s.host_keys[0].host.as_str(), s.host_keys[0].key.as_str()),
            (H1, "key0")
        );
        assert_eq!(s.host_keys[0].ctrlr_key, None);
        assert_eq!(
            (s.host_keys[1].host.as_str(), s.host_keys[1].key.as_str()),
            (H2, "key1")
        );
        assert_eq!(s.host_keys[1].ctrlr_key.as_deref(), Some("ckey1"));
        let names: Vec<&str> = c.keyring.keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["key0", "key1", "ckey1"]);
        assert_eq!(
            pollux_nvmf::mask_to_names(&pollux_nvmf::DIGESTS, c.auth.digests),
            ["sha512"]
        );
        assert_eq!(
            pollux_nvmf::mask_to_names(&pollux_nvmf::DHGROUPS, c.auth.dhgroups),
            ["null", "ffdhe2048"]
        );
        assert_eq!(c.auth.dh_threads, 2);
    }

    #[test]
    fn dhchap_flags_are_refused_naming_the_culprit() {
        let k0 = key_file("r0", K0, 0o600);
        let open = key_file("r1", K0, 0o644);
        let bad_key = key_file("r2", "DHHC-1:00:notbase64!:\n", 0o600);
        let e = cfg(&["--dhchap-key", &k0, "--host", H1])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--dhchap-key ") && e.contains("before any --host"),
            "{e}"
        );
        let e = cfg(&["--host", H1, "--dhchap-ctrl-key", &k0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a host key"), "{e}");
        let e = cfg(&["--host", H1, "--dhchap-key", &open])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&open) && e.contains("0644"), "{e}");
        let e = cfg(&["--host", H1, "--dhchap-key", &bad_key])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&bad_key) && e.contains("DHHC-1"), "{e}");
        let e = cfg(&["--host", H1, "--dhchap-key", "/nonexistent/k"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/nonexistent/k") && e.contains("cannot stat"),
            "{e}"
        );
        let e = cfg(&["--host", H1, "--dhchap-key", &k0, "--dhchap-key", &k0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("a second one"), "{e}");
        let e = cfg(&["--dhchap-digests", "md5"]).unwrap_err().to_string();
        assert!(
            e.starts_with("--dhchap-digests md5: ") && e.contains("'md5'"),
            "{e}"
        );
    }
}
