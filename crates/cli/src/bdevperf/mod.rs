//! `pollux bdevperf`: a block device benchmark modelled on SPDK's
//! `bdevperf`, on pollux-bdev and the pollux-runtime reactors.
//!
//! Bdevs come from quick flags (`--null`, `--ram SIZE`, `--uring PATH`
//! (O_DIRECT, else the page cache; the file's block size and length),
//! `--nvme TRID`) and/or SPDK's JSON configuration (`-c FILE`). As in
//! SPDK, each bdev gets one job, placed round-robin on the cores of `-m`;
//! with `-C` every core gets a job on every bdev, each on its own slice of
//! the bdev. A job is one channel with `-q` buffers, driven by a poller on
//! its core's runtime thread (see `job.rs`).
mod args;
mod job;
mod nvme;
mod report;
mod threads;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_bdev::config::{Config, ConfigError, NvmeAttach, UringParams};
use pollux_bdev::{Bdev, ChannelOptions, UringOptions};
use pollux_runtime::{Runtime, RuntimeOptions};
use pollux_softnvme::SoftDevice;

use crate::common::clock::LatClock;
use crate::common::cores::online_cpus;
use crate::common::latency;
use crate::common::mem::{human_bytes, mem_available};
use crate::common::opts::{size_in_blocks, BadOption};
use crate::common::pattern::{Mix, Pattern};
use crate::common::verify::{Verify, Written, MAX_UNITS};
use crate::nvme_open::OpenError;
use job::{Job, JobCtx, JobResult, Latency, WriteRead};
use report::JobMeta;
use threads::ThreadCpu;

pub use args::{BdevperfArgs, Workload};
pub use report::Summary;

#[derive(Debug, thiserror::Error)]
pub enum BdevperfError {
    #[error(transparent)]
    BadOption(#[from] BadOption),
    #[error("-c {path}: {source}")]
    Config {
        path: String,
        #[source]
        source: ConfigError,
    },
    #[error("{0}")]
    Bdev(#[from] pollux_bdev::Error),
    #[error("{0}")]
    Driver(#[from] pollux_host::Error),
    #[error("runtime: {0}")]
    Runtime(#[from] pollux_runtime::Error),
    #[error("{0}")]
    Args(String),
}

impl From<OpenError> for BdevperfError {
    fn from(e: OpenError) -> Self {
        BdevperfError::Args(e.to_string())
    }
}

fn bad(
    option: &'static str,
    value: impl std::fmt::Display,
    why: impl Into<String>,
) -> BdevperfError {
    BadOption::new(option, value, why).into()
}

/// Option checks that need no bdev: each names the option and its value.
fn check_args(a: &BdevperfArgs, online: &[usize]) -> Result<Vec<usize>, BdevperfError> {
    let cores = a.cpumask.cores(online)?;
    a.run.check(online, &cores, "-m", &a.cpumask.cpumask)?;
    for w in a.run.ignored() {
        eprintln!("pollux bdevperf: {w}");
    }
    if a.run.inline && a.nvme.is_empty() && a.config.is_none() {
        return Err(bad(
            "--inline",
            "",
            "steps emulated NVMe controllers: give --nvme 'trtype:soft ...' (or -c with one)",
        ));
    }
    if a.inject_failure_after == Some(0) {
        return Err(bad("--inject-failure-after", 0, "must be at least 1"));
    }
    Ok(cores)
}

/// Reads and parses `-c`.
fn read_config(a: &BdevperfArgs) -> Result<Option<Config>, BdevperfError> {
    let Some(path) = &a.config else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad("-c", path.display(), e.to_string()))?;
    Config::parse(&text)
        .map(Some)
        .map_err(|source| BdevperfError::Config {
            path: path.display().to_string(),
            source,
        })
}

/// The first `<prefix><k>` not in `used`; marks it used.
fn fresh_name(prefix: &str, used: &mut Vec<String>) -> String {
    let n = (0..)
        .map(|k| format!("{prefix}{k}"))
        .find(|n| !used.contains(n))
        .unwrap_or_else(|| prefix.to_string());
    used.push(n.clone());
    n
}

/// The bdevs of the config file, then of the quick flags.
fn make_bdevs(
    a: &BdevperfArgs,
    cfg: Option<&Config>,
    nvme: &mut impl FnMut(&str, &str) -> Result<Vec<Bdev>, BdevperfError>,
    nvme_mp: &mut impl FnMut(&str, &[String]) -> Result<Vec<Bdev>, BdevperfError>,
    attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, BdevperfError>,
) -> Result<Vec<Bdev>, BdevperfError> {
    let mut used: Vec<String> = Vec::new();
    let mut ctrl_names: Vec<String> = Vec::new();
    let mut bdevs = match cfg {
        Some(c) => {
            for e in &c.entries {
                match e {
                    pollux_bdev::config::Entry::NvmeAttach(n) => ctrl_names.push(n.name.clone()),
                    e => used.push(e.name().to_string()),
                }
            }
            c.create(attach).map_err(|source| BdevperfError::Config {
                path: a
                    .config
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                source,
            })?
        }
        None => Vec::new(),
    };
    used.extend(bdevs.iter().map(|b| b.name().to_string()));
    let bs = a.block_size;
    if a.null {
        let name = fresh_name("Null", &mut used);
        let b = Bdev::null(&name, bs, (1u64 << 40) / bs.max(1) as u64)
            .map_err(|e| bad("--block-size", bs, e.to_string()))?;
        bdevs.push(b);
    }
    for &size in &a.ram {
        let blocks = size_in_blocks(size, bs, "--block-size").map_err(|e| bad("--ram", size, e))?;
        let name = fresh_name("Malloc", &mut used);
        let b = Bdev::ram(&name, bs, blocks).map_err(|e| bad("--ram", size, e.to_string()))?;
        bdevs.push(b);
    }
    if a.iopoll && a.uring.is_empty() {
        return Err(bad(
            "--iopoll",
            "",
            "applies to --uring bdevs: give --uring PATH",
        ));
    }
    for path in &a.uring {
        let name = fresh_name("Uring", &mut used);
        // Its jobs poll until they end, so the rings need no eventfd to
        // wake a sleeping thread: COOP_TASKRUN (completions posted at the
        // next poll instead of interrupting it).
        let opts = UringOptions {
            iopoll: a.iopoll,
            yield_after: a.uring_yield,
            wake_fd: false,
            ..UringOptions::default()
        };
        let made = if a.iopoll {
            Bdev::uring(&name, path, opts)
        } else {
            let p = UringParams {
                name,
                filename: path.display().to_string(),
                block_size: None,
                uuid: None,
            };
            p.create_with(opts)
        };
        bdevs.push(made.map_err(|e| bad("--uring", path.display(), e.to_string()))?);
    }
    if a.multipath {
        let name = fresh_name("Nvme", &mut ctrl_names);
        bdevs.extend(nvme_mp(&name, &a.nvme)?);
    } else {
        for t in &a.nvme {
            let name = fresh_name("Nvme", &mut ctrl_names);
            bdevs.extend(nvme(&name, t)?);
        }
    }
    if let Some(d) = bdevs.iter().enumerate().find_map(|(i, b)| {
        bdevs[..i]
            .iter()
            .any(|o| o.name() == b.name())
            .then(|| b.name().to_string())
    }) {
        return Err(BdevperfError::Args(format!(
            "bdev name '{d}' is used twice"
        )));
    }
    Ok(bdevs)
}

/// The runtime's threads are `bdevperf-<core>`.
const THREAD_NAME: &str = "bdevperf";

/// Runs the benchmark and prints its report.
pub fn run(a: BdevperfArgs) -> Result<Summary, BdevperfError> {
    let online = online_cpus();
    let cores = check_args(&a, &online)?;
    let cfg = read_config(&a)?;
    // A socket in use is refused before the slow start-up.
    crate::rpc::check_socket(&a.rpc.rpc_socket).map_err(|e| BdevperfError::Args(e.to_string()))?;
    let quick = a.null || !a.ram.is_empty() || !a.uring.is_empty() || !a.nvme.is_empty();
    if !quick && cfg.is_none() {
        return Err(BdevperfError::Args(
            "no bdevs: give --null, --ram SIZE, --uring PATH, --nvme TRID or -c FILE".into(),
        ));
    }
    let has_nvme = !a.nvme.is_empty() || cfg.as_ref().is_some_and(Config::has_nvme);
    if a.run.inline && !has_nvme {
        return Err(bad(
            "--inline",
            "",
            "steps emulated NVMe controllers, and no bdev is NVMe",
        ));
    }
    run_with(&a, cfg.as_ref(), &cores, &online)
}

/// A run: its bdevs, NVMe controllers of any transport among them, side
/// by side.
fn run_with(
    a: &BdevperfArgs,
    cfg: Option<&Config>,
    cores: &[usize],
    online: &[usize],
) -> Result<Summary, BdevperfError> {
    let mut opener = nvme::opener(a, cores, online);
    let bdevs = {
        let op = std::cell::RefCell::new(&mut opener);
        make_bdevs(
            a,
            cfg,
            &mut |name: &str, trid: &str| Ok(op.borrow_mut().open_trid(name, trid)?),
            &mut |name: &str, trids: &[String]| Ok(op.borrow_mut().open_paths(name, trids)?),
            // (The config's error names the controller: only why here.)
            &mut |att: &NvmeAttach| {
                op.borrow_mut()
                    .attach(att)
                    .map_err(|e| BdevperfError::Args(e.why))
            },
        )?
    };
    for c in opener.controllers() {
        // A queue holds CAP.MQES commands; the channel keeps the rest of
        // -q in the queue pair's software backlog.
        let held = c.cap().mqes();
        if held < a.run.queue_depth {
            eprintln!(
                "pollux bdevperf: {}: its I/O queues hold {held} commands (CAP.MQES + 1 = {} entries, one kept empty); -q {} keeps the other {} waiting in software",
                c.describe(),
                held as u32 + 1,
                a.run.queue_depth,
                a.run.queue_depth - held
            );
        }
    }
    let inline = if a.run.inline {
        opener.soft_devices()
    } else {
        Vec::new()
    };
    let app = crate::rpc::App::new(Arc::new(registry(a, cfg, &bdevs)?), None);
    let server = crate::rpc::serve(&a.rpc, crate::rpc::methods(&app))
        .map_err(|e| BdevperfError::Args(e.to_string()))?;
    let metrics = crate::metrics::start(&a.metrics, &app, None)
        .map_err(|e| BdevperfError::Args(e.to_string()))?;
    if let Some(m) = &metrics {
        eprintln!("pollux bdevperf: metrics on http://{}/metrics", m.addr());
    }
    let r = execute(a, cores, bdevs, inline, &app);
    drop(metrics);
    drop(server);
    // The registry's bdevs hold the controllers: they go before the
    // opener, whose device thread must still be running when the
    // controllers shut down (else each waits out CSTS.SHST and CSTS.RDY).
    drop(app);
    // Controllers close after every bdev and channel, the device
    // thread last (the opener's field order).
    drop(opener);
    r
}

/// The run's bdevs in a registry (for `bdev_get_bdevs`,
/// `bdev_get_iostat`, `save_config`): each with the config entry that
/// makes it again.
fn registry(
    a: &BdevperfArgs,
    cfg: Option<&Config>,
    bdevs: &[Bdev],
) -> Result<pollux_bdev::Registry, BdevperfError> {
    use pollux_bdev::config::{Entry, LocalParams};
    let entries: &[Entry] = cfg.map(|c| c.entries.as_slice()).unwrap_or_default();
    let from_cfg = |b: &Bdev| entries.iter().any(|e| e.name() == b.name());
    // Quick bdevs of one kind were made in the order of their flags.
    let nth = |b: &Bdev, backend: &str| {
        bdevs
            .iter()
            .filter(|o| o.info().backend == backend && !from_cfg(o))
            .position(|o| o.name() == b.name())
    };
    let ctrls: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for b in bdevs.iter().filter(|b| b.info().backend == "nvme") {
            let c = b.name().rsplit_once('n').map_or(b.name(), |(c, _)| c);
            if !v.contains(&c) && !entries.iter().any(|e| e.name() == c) {
                v.push(c);
            }
        }
        v
    };
    crate::rpc::registry_of(bdevs, entries, |b| {
        let i = b.info();
        let local = LocalParams {
            name: i.name.clone(),
            num_blocks: i.num_blocks,
            block_size: i.block_size,
            uuid: Some(i.uuid),
        };
        match i.backend {
            "null" => Entry::Null(local).saved_config(std::slice::from_ref(b)),
            "ram" => Entry::Malloc(local).saved_config(std::slice::from_ref(b)),
            "uring" => {
                let f = nth(b, "uring").and_then(|k| a.uring.get(k));
                serde_json::json!({"method": "bdev_uring_create", "params": {
                    "name": i.name,
                    "filename": f.map(|p| p.display().to_string()).unwrap_or_default(),
                    "block_size": i.block_size, "uuid": i.uuid_string()}})
            }
            _ => {
                let c = b.name().rsplit_once('n').map_or(b.name(), |(c, _)| c);
                let k = ctrls.iter().position(|x| *x == c);
                let t = k.and_then(|k| a.nvme.get(k)).map_or("", String::as_str);
                crate::rpc::trid_entry(c, t)
            }
        }
    })
    .map_err(|e| BdevperfError::Args(e.to_string()))
}

/// Plans, starts and reports the jobs.
fn execute(
    a: &BdevperfArgs,
    cores: &[usize],
    mut bdevs: Vec<Bdev>,
    inline: Vec<Arc<SoftDevice>>,
    app: &crate::rpc::App,
) -> Result<Summary, BdevperfError> {
    if let Some(name) = &a.bdev {
        if !bdevs.iter().any(|b| b.name() == name) {
            let all: Vec<_> = bdevs.iter().map(|b| b.name().to_string()).collect();
            return Err(bad(
                "-T",
                name,
                format!("no such bdev (bdevs: {})", all.join(", ")),
            ));
        }
        bdevs.retain(|b| b.name() == name);
    }
    if bdevs.is_empty() {
        return Err(BdevperfError::Args("no bdevs to run on".into()));
    }
    let io = a.run.io_size;
    let depth = a.run.queue_depth as usize;
    let verify_tags = a.run.verify || a.run.workload == Workload::Verify;
    let slices = if a.every_core { cores.len() as u64 } else { 1 };
    // Per bdev: blocks per I/O and I/O units per job.
    let mut plans = Vec::new();
    for b in &bdevs {
        let info = b.info();
        if !io.is_multiple_of(info.block_size as u64) {
            return Err(bad(
                "-o",
                io,
                format!(
                    "bdev {}: not a multiple of its block size {}",
                    info.name, info.block_size
                ),
            ));
        }
        let io_blocks = io / info.block_size as u64;
        let units = info.num_blocks / io_blocks / slices;
        if units == 0 {
            return Err(bad(
                "-o",
                io,
                format!(
                    "bdev {} ({}) is smaller than {slices} I/O(s)",
                    info.name,
                    human_bytes(info.size_bytes())
                ),
            ));
        }
        if verify_tags && info.backend == "null" {
            return Err(bad(
                if a.run.verify { "--verify" } else { "-w verify" },
                "",
                format!(
                    "bdev {} is a null bdev, which keeps no data (reads return the buffer untouched): use --ram or a RAM-backed controller",
                    info.name
                ),
            ));
        }
        if verify_tags && units > MAX_UNITS {
            return Err(bad(
                "--verify",
                "",
                format!(
                    "bdev {}: {units} I/O units of -o {io} bytes per job, at most {MAX_UNITS} can be tracked",
                    info.name
                ),
            ));
        }
        plans.push((io_blocks, units));
    }
    let njobs = bdevs.len() as u64 * slices;
    // Buffers are the memory the run takes (RAM bdevs fill lazily).
    let need = njobs.saturating_mul(depth as u64).saturating_mul(io);
    if let Some(avail) = mem_available() {
        if need > avail {
            return Err(BdevperfError::Args(format!(
                "-q {} x -o {io} x {njobs} job(s) need {} of buffers, but {} is available (MemAvailable): lower -q or -o",
                a.run.queue_depth,
                human_bytes(need),
                human_bytes(avail)
            )));
        }
    }

    let (random, mix) = match a.run.workload {
        Workload::Read => (false, Mix::AllRead),
        Workload::Randread => (true, Mix::AllRead),
        Workload::Write | Workload::Verify => (false, Mix::AllWrite),
        Workload::Randwrite => (true, Mix::AllWrite),
        Workload::Rw => (false, Mix::from_percent(a.run.rwmixread())),
        Workload::Randrw => (true, Mix::from_percent(a.run.rwmixread())),
    };
    let writes = !matches!(mix, Mix::AllRead);
    let lat_clock = LatClock::new();
    let drain_timeout = Duration::from_millis(a.run.timeout_ms.max(1000).saturating_mul(2));
    let (tx, rx) = mpsc::channel::<JobResult>();
    let mut per_thread: Vec<Vec<Job>> = (0..cores.len()).map(|_| Vec::new()).collect();
    let mut metas = Vec::new();
    let mut progress = Vec::new();
    for (bi, (b, &(io_blocks, units))) in bdevs.iter().zip(&plans).enumerate() {
        let desc = b.open(writes);
        for s in 0..slices {
            let index = metas.len();
            let thread = if a.every_core {
                s as usize
            } else {
                bi % cores.len()
            };
            let ch = desc
                .channel(&ChannelOptions {
                    depth: a.run.queue_depth.into(),
                    latency: false,
                    nvme: None,
                })
                .map_err(|e| {
                    BdevperfError::Args(format!(
                        "a channel of -q {} for the job on core {}: {e}",
                        a.run.queue_depth, cores[thread]
                    ))
                })?;
            let bufs = b
                .alloc_buf(depth * io as usize)?
                .chunks(io as usize)
                .into_iter()
                .map(Some)
                .collect();
            let total = match a.run.io_count {
                Some(n) => n / njobs + u64::from((index as u64) < n % njobs),
                None => u64::MAX,
            };
            let latency = if a.run.latency > 0 {
                let hist = latency::histogram().map_err(|e| BdevperfError::Args(e.to_string()))?;
                Some(Latency {
                    clock: lat_clock,
                    submit: vec![0; depth],
                    hist,
                })
            } else {
                None
            };
            let verify = verify_tags
                .then(|| Verify::new(Written::new(units), b.info().block_shift() as u8, depth));
            let write_read = (a.run.workload == Workload::Verify).then(|| WriteRead {
                read_back: vec![false; depth],
            });
            let slow = latency.is_some() || verify.is_some() || write_read.is_some();
            let ctx = JobCtx {
                pat: Pattern {
                    rng: 0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 32),
                    random,
                    mix,
                    seq: 0,
                    units,
                },
                io_blocks,
                base_lba: s * units * io_blocks,
                ios: 0,
                stop_at: 0,
                slow,
                bufs,
                errors: 0,
                first_errors: Vec::new(),
                errlog: Default::default(),
                latency,
                verify,
                write_read,
                slot_lba: if slow { vec![0; depth] } else { Vec::new() },
                slot_unit: if slow { vec![0; depth] } else { Vec::new() },
                retry: Vec::new(),
                label: format!("{} on core {}", b.name(), cores[thread]),
                fail_at: a.inject_failure_after,
            };
            let p = Arc::new(AtomicU64::new(0));
            progress.push(p.clone());
            per_thread[thread].push(Job {
                index,
                ch,
                ctx,
                total,
                time: a
                    .run
                    .io_count
                    .is_none()
                    .then(|| Duration::from_secs(a.run.time)),
                drain_timeout,
                progress: p,
                results: tx.clone(),
            });
            metas.push(JobMeta {
                bdev: b.name().to_string(),
                core: cores[thread],
            });
        }
    }
    drop(tx);

    let rt = Arc::new(Runtime::start(
        cores,
        RuntimeOptions {
            // The jobs' own drain bound comes first; this one is a backstop.
            drain_timeout: drain_timeout + Duration::from_secs(5),
            thread_name: THREAD_NAME.into(),
            ..RuntimeOptions::default()
        },
    )?);
    app.set_runtime(rt.clone());
    let signals = rt.stop_on_signals()?;
    let trigger = rt.shutdown_trigger();
    // The polling threads' CPU time: per status line, and over the run.
    let mut second_cpu = ThreadCpu::find(THREAD_NAME, cores.len());
    let mut run_cpu = ThreadCpu::find(THREAD_NAME, cores.len());
    let mut held_seconds = Vec::new();
    let t0 = Instant::now();
    for (i, jobs) in per_thread.into_iter().enumerate() {
        let devs = if i == 0 { inline.clone() } else { Vec::new() };
        rt.send(i, move |ctx| {
            for j in jobs {
                j.start(ctx);
            }
            if !devs.is_empty() {
                // After the jobs: poll, then step, as perf's loop does.
                ctx.register_poller("softnvme inline step", move |_| {
                    let mut n = 0;
                    for d in &devs {
                        n += d.step();
                    }
                    if n > 0 {
                        pollux_runtime::Poll::Busy
                    } else {
                        pollux_runtime::Poll::Idle
                    }
                });
            }
        })?;
    }

    // Status line each second; results as jobs finish.
    let mut results: Vec<Option<JobResult>> = (0..metas.len()).map(|_| None).collect();
    let mut got = 0;
    let mut last = 0u64;
    let mut tick = 1u64;
    while got < results.len() {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => {
                let i = r.index;
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(r);
                    got += 1;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let el = t0.elapsed();
        if el >= Duration::from_secs(tick) {
            tick = el.as_secs() + 1;
            let now: u64 = progress.iter().map(|p| p.load(Ordering::Relaxed)).sum();
            let d = now.saturating_sub(last) as f64;
            // A second at (near) 0 IOPS says why when the polling threads
            // were held off their cores.
            let note = threads::starved_note(&second_cpu.shares(), "this second");
            if note.is_some() {
                held_seconds.push(el.as_secs());
            }
            eprintln!(
                "[{:>4}s] {:>12.0} IOPS, {:>9.2} MiB/s{}{}",
                el.as_secs(),
                d,
                d * io as f64 / (1 << 20) as f64,
                if trigger.is_triggered() {
                    " (stopping)"
                } else {
                    ""
                },
                note.map_or(String::new(), |n| format!("  note: {n}"))
            );
            last = now;
        }
    }
    let interrupted = trigger.is_triggered();
    // Over the run: how long its polling threads waited for their cores.
    let notes = threads::run_notes(&run_cpu.shares(), &held_seconds);
    rt.shutdown()?;
    drop(signals);
    let stats: HashMap<String, pollux_bdev::BdevStats> = bdevs
        .iter()
        .map(|b| (b.name().to_string(), b.stats()))
        .collect();
    let summary = report::report(
        a,
        cores,
        &metas,
        &results,
        &bdevs,
        &stats,
        lat_clock.ns_per_tick(),
        lat_clock.source(),
        interrupted,
        &notes,
    );
    Ok(summary)
}
