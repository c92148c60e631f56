//! `pollux perf`: an NVMe benchmark modelled on SPDK's `perf`.
//!
//! With no `-r`, one emulated controller (null backend) runs on its own
//! pinned device thread, so `pollux perf` works on any Linux machine.
//! Workers are pinned threads, one per `-c` core; each owns its queue pairs.
mod clock;
mod trid;
mod verify;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use pollux_driver::platform::soft::{SoftMode, SoftPlatform};
use pollux_driver::{Controller, ControllerOptions, QpairOptions};
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use serde_json::json;

pub use trid::{parse_size, Backend, Trid};
pub use worker::pin_to;
use worker::{Job, JobCtx, Latency, Mix, WorkerCtl, WorkerResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Read,
    Write,
    Randread,
    Randwrite,
    Rw,
    Randrw,
}

#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// Queue depth per queue pair.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 128)]
    pub queue_depth: u16,
    /// I/O size in bytes (suffixes k, m allowed).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_size)]
    pub io_size: u64,
    /// Workload pattern.
    #[arg(short = 'w', long = "workload", value_enum, default_value_t = Workload::Randread)]
    pub workload: Workload,
    /// Read percentage for rw/randrw.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 5)]
    pub time: u64,
    /// Stop after this many I/Os in total (split evenly over queue pairs).
    #[arg(long = "io-count")]
    pub io_count: Option<u64>,
    /// Worker cores: a list like 0,2-3 or a hex mask like 0x3. Default: core 0.
    #[arg(short = 'c', long = "cores", default_value = "0")]
    pub cores: String,
    /// Queue pairs per namespace.
    #[arg(short = 'P', long = "qpairs", default_value_t = 1)]
    pub qpairs: u16,
    /// Track latency (reads the clock twice per I/O).
    #[arg(short = 'L', long = "latency")]
    pub latency: bool,
    /// Transport ID, repeatable: 'trtype:soft backend:null|ram|file path:.. size:1GiB lbads:512|4096 ns:N' or 'trtype:pcie traddr:0000:00:01.0'.
    #[arg(short = 'r', long = "transport")]
    pub transport: Vec<String>,
    /// Step the emulated controller inline on the worker thread (deterministic; one worker).
    #[arg(long)]
    pub inline: bool,
    /// Core for the emulated controllers' device thread (default: the first online core without a worker).
    #[arg(long = "device-core")]
    pub device_core: Option<usize>,
    /// Tag every written block and check every read.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Per-command timeout in milliseconds (0: none).
    #[arg(long = "timeout-ms", default_value_t = 30_000)]
    pub timeout_ms: u64,
    /// Ring the SQ doorbell per command instead of once per poll.
    #[arg(long = "no-delayed-doorbell")]
    pub no_delayed_doorbell: bool,
    /// SQ doorbell batching: ring once this many commands wait (or the controller holds fewer).
    #[arg(long = "sq-batch", default_value_t = 1)]
    pub sq_batch: u16,
    /// Ring the CQ doorbell every poll instead of only when the controller needs room.
    #[arg(long = "no-lazy-cq")]
    pub no_lazy_cq: bool,
    /// Prefetch the next completion's tracker (off by default: trackers are
    /// 16 bytes and stay in L1).
    #[arg(long = "prefetch")]
    pub prefetch: bool,
    /// Copy SQEs into the ring with non-temporal stores (off by default).
    #[arg(long = "nt-copy")]
    pub nt_copy: bool,
    /// Don't use shadow doorbells even if the controller offers them.
    #[arg(long = "no-shadow-doorbell")]
    pub no_shadow_doorbell: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("{0}")]
    Trid(#[from] trid::TridError),
    #[error("{0}")]
    Driver(#[from] pollux_driver::Error),
    #[error("emulated controller: {0}")]
    Soft(#[from] pollux_softnvme::SoftError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid arguments: {0}")]
    Args(String),
}

/// What the caller needs after a run.
pub struct Summary {
    pub errors: u64,
}

/// Parses `0,2-3` or `0x5` into core numbers.
pub fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    let mut cores = Vec::new();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let m = u64::from_str_radix(hex, 16).map_err(|_| format!("bad core mask '{s}'"))?;
        cores.extend((0..64).filter(|b| m & (1 << b) != 0));
    } else {
        for part in s.split(',') {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let a: usize = a.trim().parse().map_err(|_| format!("bad core '{part}'"))?;
            let b: usize = b.trim().parse().map_err(|_| format!("bad core '{part}'"))?;
            if a > b || b >= 1024 {
                return Err(format!("bad core range '{part}'"));
            }
            cores.extend(a..=b);
        }
    }
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return Err(format!("no cores in '{s}'"));
    }
    Ok(cores)
}

fn online_cpus() -> Vec<usize> {
    // SAFETY: zeroed cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

struct Device {
    name: String,
    ctrl: Controller,
    soft: Option<Arc<SoftDevice>>,
}

fn open_device(
    t: &Trid,
    idx: usize,
    mode: SoftMode,
    thread: Option<&DeviceThread>,
    opts: &ControllerOptions,
) -> Result<Device, PerfError> {
    match t {
        Trid::Soft {
            backend,
            path,
            size,
            lba_shift,
            namespaces,
        } => {
            let backend_cfg = match backend {
                Backend::Null => BackendConfig::Null,
                Backend::Ram => BackendConfig::Ram,
                Backend::File => BackendConfig::File {
                    path: path
                        .clone()
                        .ok_or_else(|| PerfError::Args("file backend needs path:".into()))?,
                },
            };
            let ns = (0..*namespaces)
                .map(|_| NamespaceConfig {
                    backend: backend_cfg.clone(),
                    lba_shift: *lba_shift,
                    size_bytes: *size,
                })
                .collect();
            let cfg = SoftConfig {
                namespaces: ns,
                serial: format!("SOFT{idx:04}"),
                ..SoftConfig::default()
            };
            let dev = SoftDevice::new(cfg)?;
            // The device must run before bring-up can talk to it.
            if let Some(th) = thread {
                th.attach(dev.clone());
            }
            let ctrl =
                Controller::new(Box::new(SoftPlatform::new(dev.clone(), mode)), opts.clone())?;
            let b = match backend {
                Backend::Null => "null",
                Backend::Ram => "ram",
                Backend::File => "file",
            };
            Ok(Device {
                name: format!("soft{idx} ({b})"),
                ctrl,
                soft: Some(dev),
            })
        }
        Trid::Pcie { traddr } => {
            let platform = pollux_driver::platform::open_pcie(traddr)?;
            let ctrl = Controller::new(platform, opts.clone())?;
            Ok(Device {
                name: format!("pcie {}", ctrl.describe()),
                ctrl,
                soft: None,
            })
        }
    }
}

/// Runs the benchmark and prints its report.
pub fn run(a: PerfArgs) -> Result<Summary, PerfError> {
    let cores = parse_cores(&a.cores).map_err(PerfError::Args)?;
    if a.queue_depth == 0 {
        return Err(PerfError::Args("-q must be at least 1".into()));
    }
    if a.qpairs == 0 {
        return Err(PerfError::Args("-P must be at least 1".into()));
    }
    if a.io_size == 0 || !a.io_size.is_multiple_of(512) || a.io_size > 64 << 20 {
        return Err(PerfError::Args(format!(
            "-o {} must be a non-zero multiple of 512, at most 64 MiB",
            a.io_size
        )));
    }
    if a.time == 0 && a.io_count.is_none() {
        return Err(PerfError::Args("-t 0 needs --io-count".into()));
    }
    if a.inline && cores.len() != 1 {
        return Err(PerfError::Args("--inline steps the emulated controller on the worker thread: use exactly one worker core".into()));
    }
    let trids: Vec<Trid> = if a.transport.is_empty() {
        vec![Trid::Soft {
            backend: Backend::Null,
            path: None,
            size: 1 << 40,
            lba_shift: 9,
            namespaces: 1,
        }]
    } else {
        a.transport
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    };
    if a.inline && trids.iter().any(|t| !matches!(t, Trid::Soft { .. })) {
        return Err(PerfError::Args(
            "--inline only applies to trtype:soft".into(),
        ));
    }
    let online = online_cpus();
    if let Some(c) = cores.iter().find(|c| !online.contains(c)) {
        return Err(PerfError::Args(format!(
            "core {c} is not available (online: {online:?})"
        )));
    }

    // The device thread must outlive the controllers (their orderly
    // shutdown needs it), so it is declared first and dropped last.
    let needs_thread = !a.inline && trids.iter().any(|t| matches!(t, Trid::Soft { .. }));
    let device_core = a
        .device_core
        .or_else(|| online.iter().copied().find(|c| !cores.contains(c)));
    let dev_thread = if needs_thread {
        Some(DeviceThread::spawn(device_core)?)
    } else {
        None
    };
    let mode = if a.inline {
        SoftMode::Inline
    } else {
        SoftMode::Threaded
    };
    let copts = ControllerOptions {
        shadow_doorbells: !a.no_shadow_doorbell,
        ..ControllerOptions::default()
    };
    let mut devices = Vec::new();
    for (i, t) in trids.iter().enumerate() {
        devices.push(open_device(t, i, mode, dev_thread.as_ref(), &copts)?);
    }

    let qopts = QpairOptions {
        depth: a.queue_depth,
        delayed_sq_doorbell: !a.no_delayed_doorbell,
        sq_doorbell_batch: a.sq_batch.max(1),
        lazy_cq_doorbell: !a.no_lazy_cq,
        prefetch: a.prefetch,
        nt_sqe_copy: a.nt_copy,
        timeout: (a.timeout_ms > 0).then(|| Duration::from_millis(a.timeout_ms)),
        ..QpairOptions::default()
    };
    let (random, mix) = match a.workload {
        Workload::Read => (false, Mix::AllRead),
        Workload::Randread => (true, Mix::AllRead),
        Workload::Write => (false, Mix::AllWrite),
        Workload::Randwrite => (true, Mix::AllWrite),
        Workload::Rw | Workload::Randrw => (
            a.workload == Workload::Randrw,
            match a.rwmixread {
                100 => Mix::AllRead,
                0 => Mix::AllWrite,
                m => Mix::Reads(((m as u64) << 32) / 100),
            },
        ),
    };

    let lat_clock = clock::LatClock::new();
    // Jobs: every (device, namespace, qpair) round-robin over the workers.
    let mut per_worker: Vec<Vec<Job>> = (0..cores.len()).map(|_| Vec::new()).collect();
    let mut written: HashMap<(usize, u32), Arc<verify::Written>> = HashMap::new();
    let mut njobs = 0usize;
    let total_jobs: u64 = devices
        .iter()
        .map(|d| d.ctrl.namespaces().len() as u64)
        .sum::<u64>()
        * a.qpairs as u64;
    if total_jobs == 0 {
        return Err(PerfError::Args("no namespaces found".into()));
    }
    for (di, d) in devices.iter().enumerate() {
        for ns in d.ctrl.namespaces() {
            let io = a.io_size as usize;
            if !io.is_multiple_of(ns.lba_size() as usize) {
                return Err(PerfError::Args(format!(
                    "{} nsid {}: -o {io} is not a multiple of the LBA size {}",
                    d.name,
                    ns.nsid,
                    ns.lba_size()
                )));
            }
            let nlb = (io >> ns.lba_shift) as u32;
            let units = ns.nsze / nlb as u64;
            if units == 0 {
                return Err(PerfError::Args(format!(
                    "{} nsid {}: namespace smaller than one I/O",
                    d.name, ns.nsid
                )));
            }
            for p in 0..a.qpairs {
                let w = njobs % cores.len();
                let qp = d.ctrl.alloc_qpair(qopts.clone())?;
                let depth = qp.depth() as usize;
                let buf = d.ctrl.alloc_dma(depth * io)?;
                let total = match a.io_count {
                    Some(n) => n / total_jobs + u64::from((njobs as u64) < n % total_jobs),
                    None => u64::MAX,
                };
                let verify = if a.verify {
                    if units > verify::MAX_UNITS {
                        return Err(PerfError::Args(format!(
                            "--verify: namespace has {units} I/O units, at most {}",
                            verify::MAX_UNITS
                        )));
                    }
                    let w = written
                        .entry((di, ns.nsid))
                        .or_insert_with(|| verify::Written::new(units))
                        .clone();
                    Some(verify::Verify::new(w, ns.lba_shift, depth))
                } else {
                    None
                };
                let latency = if a.latency {
                    // Ticks: up to an hour at a few GHz.
                    let hist = Histogram::new_with_bounds(1, 36_000_000_000_000, 3)
                        .map_err(|e| PerfError::Args(e.to_string()))?;
                    Some(Latency {
                        clock: lat_clock,
                        submit: vec![0; depth],
                        hist,
                    })
                } else {
                    None
                };
                let ctx = JobCtx {
                    label: format!(
                        "{} NSID {} qpair {} from core {}",
                        d.name, ns.nsid, p, cores[w]
                    ),
                    ns: *ns,
                    buf,
                    io_size: io,
                    nlb,
                    units,
                    rng: 0x9E37_79B9_7F4A_7C15 ^ ((njobs as u64 + 1) << 32 | ns.nsid as u64),
                    random,
                    mix,
                    seq: 0,
                    total,
                    stop_at: 0,
                    ios: 0,
                    errors: 0,
                    first_errors: Vec::new(),
                    slow: latency.is_some() || verify.is_some(),
                    latency,
                    verify,
                    slot_lba: if a.verify { vec![0; depth] } else { Vec::new() },
                    retry: Vec::new(),
                };
                per_worker[w].push(Job { qp, ctx });
                njobs += 1;
            }
        }
    }

    let inline_devs: Vec<Arc<SoftDevice>> = if a.inline {
        devices.iter().filter_map(|d| d.soft.clone()).collect()
    } else {
        Vec::new()
    };
    let ctls: Vec<WorkerCtl> = cores
        .iter()
        .map(|_| WorkerCtl {
            stop: AtomicBool::new(false),
            progress: AtomicU64::new(0),
        })
        .collect();
    let drain_timeout = Duration::from_millis(a.timeout_ms.max(1000) * 2);
    let t0 = Instant::now();
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = per_worker
            .into_iter()
            .zip(&ctls)
            .zip(&cores)
            .map(|((jobs, ctl), &core)| {
                let inl = inline_devs.clone();
                s.spawn(move || worker::run(Some(core), jobs, inl, ctl, drain_timeout))
            })
            .collect();
        // Status line each second; stop after -t seconds.
        let mut last = 0u64;
        let mut tick = 1u64;
        loop {
            if handles.iter().all(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            let el = t0.elapsed();
            if a.time > 0 && el >= Duration::from_secs(a.time) {
                for c in &ctls {
                    c.stop.store(true, Ordering::Relaxed);
                }
            }
            if el >= Duration::from_secs(tick) {
                tick += 1;
                let now: u64 = ctls
                    .iter()
                    .map(|c| c.progress.load(Ordering::Relaxed))
                    .sum();
                if !a.json {
                    eprintln!(
                        "[{:>4}s] {:>12.0} IOPS, {:>9.2} MiB/s",
                        el.as_secs(),
                        (now - last) as f64,
                        (now - last) as f64 * a.io_size as f64 / (1 << 20) as f64
                    );
                }
                last = now;
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("perf worker panicked")))
            .collect()
    });

    let device_stats: Vec<_> = devices
        .iter()
        .filter_map(|d| d.soft.as_ref().map(|s| (d.name.clone(), s.stats())))
        .collect();
    let summary = report(
        &a,
        &results,
        &device_stats,
        lat_clock.ns_per_tick(),
        lat_clock.source(),
    );
    drop(devices);
    drop(dev_thread);
    Ok(summary)
}

/// A latency statistic in microseconds: `q` a quantile, `None` the mean.
fn lat_us(h: &Histogram<u64>, q: Option<f64>, ns_per_tick: f64) -> f64 {
    let ticks = match q {
        Some(q) => h.value_at_quantile(q) as f64,
        None => h.mean(),
    };
    ticks * ns_per_tick / 1000.0
}

fn report(
    a: &PerfArgs,
    results: &[WorkerResult],
    device_stats: &[(String, pollux_softnvme::DeviceStats)],
    ns_per_tick: f64,
    clock_source: &str,
) -> Summary {
    let us = |ticks: u64| ticks as f64 * ns_per_tick / 1000.0;
    let mib = |ios: f64, io: usize| ios * io as f64 / (1u64 << 20) as f64;
    let mut rows = Vec::new();
    let mut total_hist: Option<Histogram<u64>> = None;
    let (
        mut t_ios,
        mut t_err,
        mut t_iops,
        mut t_mib,
        mut sq_db,
        mut cq_db,
        mut shadow,
        mut submitted,
    ) = (0u64, 0u64, 0f64, 0f64, 0u64, 0u64, 0u64, 0u64);
    let mut cores_json = Vec::new();
    let mut errors_list = Vec::new();
    let mut max_elapsed = 0f64;
    for r in results {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        max_elapsed = max_elapsed.max(secs);
        let all: u64 = r.jobs.iter().map(|j| j.ios).sum::<u64>().max(1);
        let mut core_ios = 0f64;
        let mut core_err = 0u64;
        for j in &r.jobs {
            // I/Os inside the measurement window, attributed by share.
            let ios_w = r.ios_in_window as f64 * j.ios as f64 / all as f64;
            let iops = ios_w / secs;
            t_ios += j.ios;
            t_err += j.errors;
            core_err += j.errors;
            core_ios += iops;
            t_iops += iops;
            t_mib += mib(iops, j.io_size);
            sq_db += j.qp.sq_doorbells;
            cq_db += j.qp.cq_doorbells;
            shadow += j.qp.shadow_updates;
            submitted += j.qp.submitted;
            errors_list.extend(j.first_errors.iter().map(|e| format!("{}: {e}", j.label)));
            if let Some(h) = &j.hist {
                match &mut total_hist {
                    None => total_hist = Some(h.clone()),
                    Some(t) => {
                        let _ = t.add(h);
                    }
                }
            }
            rows.push(json!({
                "name": j.label,
                "ios": j.ios,
                "iops": iops,
                "mib_s": mib(iops, j.io_size),
                "errors": j.errors,
                "avg_lat_us": j.hist.as_ref().map(|h| lat_us(h, None, ns_per_tick)),
                "min_lat_us": j.hist.as_ref().map(|h| us(h.min())),
                "max_lat_us": j.hist.as_ref().map(|h| us(h.max())),
                "p99_lat_us": j.hist.as_ref().map(|h| lat_us(h, Some(0.99), ns_per_tick)),
                "sq_doorbells": j.qp.sq_doorbells,
                "cq_doorbells": j.qp.cq_doorbells,
                "shadow_updates": j.qp.shadow_updates,
                "polls": j.qp.polls,
                "queued": j.qp.queued,
                "timeouts": j.qp.timeouts,
            }));
        }
        if let Some(e) = &r.drain_error {
            t_err += 1;
            errors_list.push(e.clone());
        }
        cores_json
            .push(json!({ "core": r.core, "iops": core_ios, "seconds": secs, "errors": core_err }));
    }
    let per_io = |x: u64| {
        if submitted == 0 {
            0.0
        } else {
            x as f64 / submitted as f64
        }
    };
    let lat = |q: Option<f64>| total_hist.as_ref().map(|h| lat_us(h, q, ns_per_tick));
    let soft_json: Vec<_> = device_stats
        .iter()
        .map(|(n, s)| json!({ "name": n, "io_commands": s.io_commands, "admin_commands": s.admin_commands, "errors": s.errors, "cq_full_waits": s.cq_full_waits, "shadow_doorbell_enabled": s.shadow_doorbell_enabled }))
        .collect();
    if a.json {
        let out = json!({
            "config": {
                "queue_depth": a.queue_depth, "io_size": a.io_size, "workload": format!("{:?}", a.workload).to_lowercase(),
                "rwmixread": a.rwmixread, "time_s": a.time, "io_count": a.io_count, "cores": a.cores, "qpairs_per_ns": a.qpairs,
                "inline": a.inline, "verify": a.verify, "latency": a.latency, "latency_clock": clock_source,
                "delayed_doorbell": !a.no_delayed_doorbell, "sq_batch": a.sq_batch, "lazy_cq": !a.no_lazy_cq,
                "prefetch": a.prefetch, "nt_copy": a.nt_copy, "shadow_doorbell": !a.no_shadow_doorbell,
            },
            "devices": rows,
            "cores": cores_json,
            "emulated_controllers": soft_json,
            "errors": errors_list,
            "total": {
                "iops": t_iops, "mib_s": t_mib, "ios": t_ios, "errors": t_err, "seconds": max_elapsed,
                "avg_lat_us": lat(None), "min_lat_us": total_hist.as_ref().map(|h| us(h.min())),
                "p50_lat_us": lat(Some(0.5)), "p99_lat_us": lat(Some(0.99)),
                "max_lat_us": total_hist.as_ref().map(|h| us(h.max())),
                "sq_doorbells_per_io": per_io(sq_db), "cq_doorbells_per_io": per_io(cq_db),
                "shadow_updates_per_io": per_io(shadow),
            }
        });
        println!("{out}");
    } else {
        let bar = "=".repeat(110);
        println!("{bar}");
        println!("{:<62}{:>48}", "", "Latency(us)");
        println!(
            "{:<50}: {:>12} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        for r in &rows {
            let f = |k: &str| r[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
            println!(
                "{:<50}: {:>12.2} {:>10.2} {:>10} {:>10} {:>10}",
                r["name"].as_str().unwrap_or(""),
                r["iops"].as_f64().unwrap_or(0.0),
                r["mib_s"].as_f64().unwrap_or(0.0),
                f("avg_lat_us"),
                f("min_lat_us"),
                f("max_lat_us")
            );
        }
        println!("{bar}");
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<50}: {:>12.2} {:>10.2} {:>10} {:>10} {:>10}",
            "Total",
            t_iops,
            t_mib,
            fmt(lat(None)),
            fmt(total_hist.as_ref().map(|h| us(h.min()))),
            fmt(total_hist.as_ref().map(|h| us(h.max())))
        );
        if a.latency {
            println!(
                "Latency percentiles (us): p50 {}  p99 {}",
                fmt(lat(Some(0.5))),
                fmt(lat(Some(0.99)))
            );
        }
        println!(
            "Doorbell writes per I/O: SQ {:.4}  CQ {:.4}  (shadow updates {:.4})",
            per_io(sq_db),
            per_io(cq_db),
            per_io(shadow)
        );
        println!("I/Os: {t_ios}  errors: {t_err}");
        for e in &errors_list {
            println!("error: {e}");
        }
    }
    Summary { errors: t_err }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_parse() {
        assert_eq!(parse_cores("0").unwrap(), vec![0]);
        assert_eq!(parse_cores("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cores("0x5").unwrap(), vec![0, 2]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("x").is_err());
        assert!(parse_cores("0x0").is_err());
    }
}
