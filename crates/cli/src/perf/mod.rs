//! `pollux perf`: an NVMe benchmark modelled on SPDK's `perf`.
//!
//! With no `-r`, one emulated controller (null backend) runs on its own
//! pinned device thread, so `pollux perf` works on any Linux machine.
//! Workers are pinned threads, one per `-c` core; each owns -P queue pairs
//! on every namespace (as SPDK's perf).
mod args;
mod hybrid;
mod report;
mod signals;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_host::{Controller, ControllerOptions, DmaMemory, IoBuf, QpairOptions};
use pollux_softnvme::SoftDevice;

use crate::common::cores::online_cpus;
use crate::common::mem::{human_bytes, mem_available};
use crate::common::opts::{cores_option, BadOption};
use crate::common::pattern::{Mix, Pattern};
use crate::common::{clock, latency, verify};
use crate::emulator::SoftEmulator;
use pollux_host::trid;
use trid::{Backend, SoftTrid, Trid};
use worker::{Job, JobCtx, Latency, MpJob, WorkerCtl, WorkerResult};

use args::PollMode;
pub use args::{PerfArgs, Workload};
pub use report::Summary;

#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("{0}")]
    Trid(#[from] trid::TridError),
    #[error("{0}")]
    Driver(#[from] pollux_host::Error),
    #[error("{0}")]
    Connect(#[from] pollux_host::ConnectError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid arguments: {0}")]
    Args(String),
    #[error(transparent)]
    BadOption(#[from] BadOption),
    #[error("{0}")]
    Multipath(#[from] pollux_host::MultipathError),
    /// The run would need more memory than the machine has.
    #[error("{what} need {} of {kind} memory, but {} is available ({source_}): lower -q, -o or -P, or use fewer namespaces or devices", human_bytes(*.need), human_bytes(*.avail))]
    Memory {
        what: String,
        need: u64,
        kind: &'static str,
        avail: u64,
        source_: &'static str,
    },
}

fn bad(option: &'static str, value: impl std::fmt::Display, why: impl Into<String>) -> PerfError {
    BadOption::new(option, value, why).into()
}

pub(crate) struct Device {
    pub name: String,
    pub ctrl: Controller,
    /// The emulated device behind an emulated controller.
    pub soft: Option<Arc<SoftDevice>>,
    mem: DmaMemory,
}

/// Opens the controller `t` names (`trtype:soft` through `emu`), the
/// `idx`-th of the run (its name in the report).
pub(crate) fn open_device(
    t: &Trid,
    idx: usize,
    emu: &mut SoftEmulator,
    opts: &ControllerOptions,
) -> Result<Device, PerfError> {
    let ctrl = pollux_host::connect_with(t, opts, emu)?;
    let (name, soft) = match t {
        Trid::Soft(s) => {
            let b = match s.backend {
                Backend::Null => "null",
                Backend::Ram => "ram",
                Backend::File => "file",
            };
            (format!("soft{idx} ({b})"), emu.devices().last().cloned())
        }
        Trid::Pcie { .. } => (format!("pcie {}", ctrl.describe()), None),
        Trid::Tcp(_) => (ctrl.describe(), None),
    };
    Ok(Device {
        name,
        ctrl,
        soft,
        mem: t.dma_memory(),
    })
}

/// Option checks that need no device: each names the option and its value.
fn check_args(a: &PerfArgs, online: &[usize]) -> Result<Vec<usize>, PerfError> {
    let cores = cores_option("-c", &a.cores, online)?;
    a.run.check(online, &cores, "-c", &a.cores)?;
    for w in a.run.ignored() {
        eprintln!("pollux perf: {w}");
    }
    if a.qpairs == 0 {
        return Err(bad("-P", 0, "must be at least 1"));
    }
    Ok(cores)
}

/// Option checks against the transport IDs, before any device exists.
fn check_trids(a: &PerfArgs, trids: &[Trid]) -> Result<(), PerfError> {
    if a.multipath {
        if trids.len() < 2 {
            eprintln!("pollux perf: --multipath with one path: no failover");
        }
        if let Some(t) = trids.iter().find(|t| !matches!(t, Trid::Tcp(_))) {
            // A buffer is the first path's DMA memory: any memory over
            // TCP, but a PCIe device (emulated or not) reaches only its
            // own mappings.
            return Err(bad(
                "--multipath",
                "",
                format!("paths must be NVMe/TCP (buffers are shared by the paths), not {t:?}"),
            ));
        }
        if a.mode() != PollMode::Polled {
            return Err(bad(
                "--poll-mode",
                a.mode().name(),
                "--multipath polls its paths (no interrupts, no hybrid sleeps)",
            ));
        }
    }
    if a.run.inline && trids.iter().any(|t| !matches!(t, Trid::Soft(_))) {
        return Err(PerfError::Args(
            "--inline only applies to trtype:soft".into(),
        ));
    }
    match a.mode() {
        PollMode::Polled => {}
        _ if !a.run.inline => {}
        PollMode::Interrupts => {
            return Err(PerfError::Args(
                "--interrupts needs a controller that runs by itself: not with --inline (the worker steps the device)".into(),
            ))
        }
        PollMode::Hybrid => {
            return Err(PerfError::Args(
                "--poll-mode hybrid needs a controller that runs by itself: not with --inline (the worker steps the device, so nothing completes while it sleeps)".into(),
            ))
        }
    }
    if a.run.verify {
        for (i, t) in trids.iter().enumerate() {
            if let Trid::Soft(SoftTrid {
                backend: Backend::Null,
                ..
            }) = t
            {
                let which = match a.transport.get(i) {
                    Some(s) => format!("-r '{s}' uses backend:null"),
                    None => "the default transport is trtype:soft backend:null".into(),
                };
                return Err(bad(
                    "--verify",
                    "",
                    format!(
                        "{which}, which keeps no data (reads return zeros), so every read after a write would be reported as corrupt: use backend:ram or backend:file"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Why a run with emulated controllers on a device thread (not --inline)
/// pinned to `device_core` (None: not pinned, no core was left over) will
/// be slow, if it shares a core with the workers on `cores`: the device
/// thread and a worker both poll without sleeping, so they take turns on
/// the core, which can cut IOPS by orders of magnitude.
fn shared_core_warning(
    a: &PerfArgs,
    device_core: Option<usize>,
    cores: &[usize],
) -> Option<String> {
    if a.run.inline {
        return None;
    }
    let why = "both poll without sleeping and take turns on the core, which can cut IOPS by orders of magnitude";
    match device_core {
        Some(c) if cores.contains(&c) => Some(format!(
            "the emulated controller's device thread runs on core {c}, which is also a worker core (-c {}): {why}; give it a core of its own (--device-core outside -c) or step the device from the worker with --inline",
            a.cores
        )),
        Some(_) => None,
        None => Some(format!(
            "every core this process may use is a worker core (-c {}), so the emulated controller's device thread (not pinned) shares them: {why}; leave a core for it (fewer cores in -c) or step the device from the worker with --inline (one worker core)",
            a.cores
        )),
    }
}

/// What one job (queue pair) on a namespace needs, checked before any
/// queue pair or buffer is allocated.
struct NsPlan {
    nlb: u32,
    units: u64,
}

/// Option checks against the opened controllers and their namespaces, for
/// a run on `ncores` worker cores (each with -P queue pairs on every
/// namespace).
fn check_devices(
    a: &PerfArgs,
    devices: &[Device],
    ncores: usize,
) -> Result<Vec<Vec<NsPlan>>, PerfError> {
    let io = a.run.io_size;
    let mut plans = Vec::new();
    for d in devices {
        // A queue holds CAP.MQES commands (MQES + 1 entries, one kept
        // empty); a deeper -q keeps the rest in the queue pair's software
        // backlog, as SPDK's perf does.
        let held = qpair_depth(d, a.run.queue_depth);
        if held < a.run.queue_depth {
            eprintln!(
                "pollux perf: {}: its I/O queues hold {held} commands (CAP.MQES + 1 = {} entries, one kept empty); -q {} keeps the other {} waiting in software",
                d.name,
                held as u32 + 1,
                a.run.queue_depth,
                a.run.queue_depth - held
            );
        }
        let nns = d.ctrl.namespaces().len() as u64;
        let need = nns * a.qpairs as u64 * ncores as u64;
        if need > d.ctrl.io_queues() as u64 {
            return Err(bad(
                "-P",
                a.qpairs,
                format!(
                    "{}: {nns} namespace(s) x -P {} x {ncores} worker core(s) (-c {}) need {need} I/O queue pairs, but the controller granted {}: lower -P or use fewer cores",
                    d.name,
                    a.qpairs,
                    a.cores,
                    d.ctrl.io_queues()
                ),
            ));
        }
        let mut ns_plans = Vec::new();
        for ns in d.ctrl.namespaces() {
            if !io.is_multiple_of(ns.lba_size() as u64) {
                return Err(bad(
                    "-o",
                    io,
                    format!(
                        "{} nsid {}: not a multiple of the LBA size {}",
                        d.name,
                        ns.nsid(),
                        ns.lba_size()
                    ),
                ));
            }
            let nlb = u32::try_from(io >> ns.lba_shift())
                .map_err(|_| bad("-o", io, "too many blocks for one I/O"))?;
            let units = ns.nsze() / nlb as u64;
            if units == 0 {
                return Err(bad(
                    "-o",
                    io,
                    format!(
                        "{} nsid {}: the namespace ({} bytes) is smaller than one I/O",
                        d.name,
                        ns.nsid(),
                        ns.size_bytes()
                    ),
                ));
            }
            if a.run.verify && units > verify::MAX_UNITS {
                return Err(bad(
                    "--verify",
                    "",
                    format!(
                        "{} nsid {}: the namespace has {units} I/O units of -o {io} bytes, at most {} can be tracked",
                        d.name,
                        ns.nsid(),
                        verify::MAX_UNITS
                    ),
                ));
            }
            ns_plans.push(NsPlan { nlb, units });
        }
        plans.push(ns_plans);
    }
    Ok(plans)
}

/// Commands a queue pair of `d` holds for a run at `depth` (-q): the
/// depth, or what the controller's queues hold if that is less.
fn qpair_depth(d: &Device, depth: u16) -> u16 {
    depth.min(d.ctrl.cap().mqes()).max(1)
}

/// DMA bytes one queue pair holding `depth` commands (with I/O buffers
/// for `slots`, -q, of `io` bytes) takes on `d`: the buffers plus the SQ,
/// CQ and PRP list pool the driver
/// allocates (the driver's sizing: CQ up to 4 x depth entries, a PRP list
/// slice per tracker of `max_transfer / 4 KiB + 1` entries rounded up to a
/// power of two, 2..=512). Each allocation is rounded up to 4 KiB.
fn qpair_dma_bytes(d: &Device, depth: u64, slots: u64, io: u64) -> u64 {
    let page = |n: u64| n.div_ceil(4096).saturating_mul(4096);
    let entries = d.ctrl.cap().mqes() as u64 + 1;
    let cq = (4 * depth).clamp(depth + 1, entries.max(depth + 1));
    let list = ((d.ctrl.max_transfer() as u64).div_ceil(4096) + 1)
        .next_power_of_two()
        .clamp(2, 512);
    page(slots.saturating_mul(io))
        .saturating_add(page((depth + 1) * 64))
        .saturating_add(page(cq * 16))
        .saturating_add(page(depth * list * 8))
}

/// Refuses a run whose DMA buffers (and --verify bitmaps) cannot fit in
/// the memory the machine has, before anything is allocated: the buffers
/// are populated (MAP_POPULATE) or pinned at allocation, so an impossible
/// size would otherwise push the machine into swap or the OOM killer.
fn check_memory(
    a: &PerfArgs,
    devices: &[Device],
    plans: &[Vec<NsPlan>],
    ncores: usize,
) -> Result<(), PerfError> {
    let depth = a.run.queue_depth as u64;
    let (mut anon, mut huge, mut huge_or_anon, mut qpairs) = (0u64, 0u64, 0u64, 0u64);
    for (d, ns_plans) in devices.iter().zip(plans) {
        let held = qpair_depth(d, a.run.queue_depth) as u64;
        let per_qp = qpair_dma_bytes(d, held, depth, a.run.io_size);
        let n = ns_plans.len() as u64 * a.qpairs as u64 * ncores as u64;
        qpairs += n;
        let bytes = per_qp.saturating_mul(n);
        match d.mem {
            DmaMemory::Anon => anon = anon.saturating_add(bytes),
            DmaMemory::Huge => huge = huge.saturating_add(bytes),
            DmaMemory::HugeThenAnon => huge_or_anon = huge_or_anon.saturating_add(bytes),
        }
        if a.run.verify {
            // One bit per I/O unit, shared by the queue pairs of a namespace.
            for p in ns_plans {
                anon = anon.saturating_add(p.units.div_ceil(64) * 8);
            }
        }
    }
    let what = format!(
        "-q {} x -o {} x {qpairs} queue pair(s) (-P {} per namespace and worker core, {ncores} core(s), {} device(s)){}",
        a.run.queue_depth,
        a.run.io_size,
        a.qpairs,
        devices.len(),
        if a.run.verify {
            " and the --verify bitmaps"
        } else {
            ""
        }
    );
    let free_huge = DmaMemory::free_huge_bytes;
    if huge > 0 {
        let avail = free_huge();
        // Buffers are carved from whole 2 MiB pages.
        if huge > avail {
            return Err(PerfError::Memory {
                what,
                need: huge,
                kind: "hugepage",
                avail,
                source_: "free 2 MiB hugepages; reserve more with `pollux setup hugepages N`",
            });
        }
    }
    let Some(avail) = mem_available() else {
        tracing::debug!("no MemAvailable in /proc/meminfo: memory check skipped");
        return Ok(());
    };
    if huge_or_anon > 0 {
        let avail_both = avail.saturating_add(free_huge());
        let need = anon.saturating_add(huge_or_anon);
        if need > avail_both {
            return Err(PerfError::Memory {
                what,
                need,
                kind: "DMA",
                avail: avail_both,
                source_: "MemAvailable in /proc/meminfo plus free 2 MiB hugepages",
            });
        }
    }
    if anon > avail {
        return Err(PerfError::Memory {
            what,
            need: anon,
            kind: "DMA",
            avail,
            source_: "MemAvailable in /proc/meminfo",
        });
    }
    Ok(())
}

/// What makes one job's context besides the options.
struct JobShape {
    label: String,
    ns: pollux_host::Namespace,
    bufs: Vec<Option<IoBuf>>,
    nlb: u32,
    units: u64,
    /// I/Os to submit (`u64::MAX`: until stopped).
    total: u64,
    /// The job's number (seeds its pattern).
    seed: u64,
    random: bool,
    mix: Mix,
}

/// A job's context: its pattern, and -L's and --verify's state.
fn job_ctx(
    a: &PerfArgs,
    j: JobShape,
    written: Option<Arc<verify::Written>>,
    lat_clock: clock::LatClock,
) -> Result<JobCtx, PerfError> {
    let depth = a.run.queue_depth as usize;
    let JobShape {
        label,
        ns,
        bufs,
        nlb,
        units,
        total,
        seed,
        random,
        mix,
    } = j;
    let verify = written.map(|w| verify::Verify::new(w, ns.lba_shift(), depth));
    let latency = if a.run.latency > 0 {
        // Reads and writes apart when the workload mixes them.
        let n = if matches!(mix, Mix::AllRead | Mix::AllWrite) {
            1
        } else {
            2
        };
        let hist = (0..n)
            .map(|_| latency::histogram())
            .collect::<Result<_, _>>()
            .map_err(|e| PerfError::Args(e.to_string()))?;
        Some(Latency {
            clock: lat_clock,
            submit: vec![0; depth],
            mixed: n - 1,
            hist,
        })
    } else {
        None
    };
    Ok(JobCtx {
        label,
        ns,
        bufs,
        io_size: a.run.io_size as usize,
        nlb,
        pat: Pattern {
            units,
            rng: 0x9E37_79B9_7F4A_7C15 ^ ((seed + 1) << 32 | ns.nsid() as u64),
            random,
            mix,
            seq: 0,
        },
        total,
        stop_at: 0,
        ios: 0,
        errors: 0,
        first_errors: Vec::new(),
        errlog: Default::default(),
        slow: latency.is_some() || verify.is_some(),
        latency,
        verify,
        slot_lba: if a.run.verify {
            vec![0; depth]
        } else {
            Vec::new()
        },
        retry: Vec::new(),
    })
}

/// Runs the benchmark and prints its report.
pub fn run(a: PerfArgs) -> Result<Summary, PerfError> {
    let online = online_cpus();
    let cores = check_args(&a, &online)?;
    let trids: Vec<Trid> = if a.transport.is_empty() {
        vec![Trid::Soft(SoftTrid::default())]
    } else {
        a.transport
            .iter()
            .map(|s| trid::parse(s))
            .collect::<Result<Vec<_>, _>>()?
    };
    let trids: Vec<Trid> = if a.multipath {
        trids
            .iter()
            .map(pollux_host::multipath::path_trid)
            .collect()
    } else {
        trids
    };
    check_trids(&a, &trids)?;

    // The emulator (its device thread) must outlive the controllers
    // (their orderly shutdown needs it), so it is declared first and
    // dropped last.
    let device_core = a.run.device.core(&cores, &online);
    let mut emu = SoftEmulator::new(a.run.inline, device_core);
    if trids.iter().any(|t| matches!(t, Trid::Soft(_))) {
        emu.start_thread()?;
        if let Some(w) = shared_core_warning(&a, device_core, &cores) {
            eprintln!("pollux perf: {w}");
        }
    }
    let defaults = ControllerOptions::default();
    let copts = ControllerOptions {
        shadow_doorbells: !a.no_shadow_doorbell,
        // Enough queue pairs for -P on every namespace we know of up front,
        // on every worker core (the controller may grant fewer: checked
        // below).
        io_queues: trids
            .iter()
            .map(|t| match t {
                Trid::Soft(s) => s.namespaces as u64,
                Trid::Pcie { .. } | Trid::Tcp(_) => 1,
            })
            .max()
            .unwrap_or(1)
            .saturating_mul(a.qpairs as u64)
            .saturating_mul(cores.len() as u64)
            .clamp(defaults.io_queues as u64, u16::MAX as u64 - 1) as u16,
        ..defaults
    };
    let mut devices = Vec::new();
    for (i, t) in trids.iter().enumerate() {
        devices.push(open_device(t, i, &mut emu, &copts)?);
    }
    let plans = check_devices(&a, &devices, cores.len())?;
    let total_jobs: u64 = if a.multipath {
        // One namespace over all the paths.
        plans.first().map_or(0, |p| p.len().min(1) as u64) * a.qpairs as u64 * cores.len() as u64
    } else {
        plans.iter().map(|p| p.len() as u64).sum::<u64>() * a.qpairs as u64 * cores.len() as u64
    };
    if total_jobs == 0 {
        return Err(PerfError::Args("no namespaces found".into()));
    }
    check_memory(&a, &devices, &plans, cores.len())?;

    let qopts = QpairOptions {
        depth: a.run.queue_depth,
        delayed_sq_doorbell: !a.no_delayed_doorbell,
        sq_doorbell_batch: a.sq_batch.max(1),
        lazy_cq_doorbell: !a.no_lazy_cq,
        prefetch: a.prefetch,
        nt_sqe_copy: a.nt_copy,
        cq_line_batch: a.cq_line_batch,
        interrupts: a.mode() == PollMode::Interrupts,
        timeout: a.run.timeout(),
        ..QpairOptions::default()
    };
    let (random, mix) = match a.run.workload {
        Workload::Read => (false, Mix::AllRead),
        Workload::Randread => (true, Mix::AllRead),
        Workload::Write => (false, Mix::AllWrite),
        Workload::Randwrite => (true, Mix::AllWrite),
        Workload::Rw | Workload::Randrw => (
            a.run.workload == Workload::Randrw,
            Mix::from_percent(a.run.rwmixread()),
        ),
    };

    let lat_clock = clock::LatClock::new();
    // With --multipath the devices are the paths of one namespace: they
    // go into the multipath object (and the loop over devices below has
    // none left).
    let multipath = if a.multipath {
        let policy = a.multipath_policy.parse().map_err(PerfError::Args)?;
        let selector = a.multipath_selector.parse().map_err(PerfError::Args)?;
        let paths = devices.drain(..).map(|d| (d.name, d.ctrl)).collect();
        Some(pollux_host::Multipath::new(paths, None, policy, selector)?)
    } else {
        None
    };
    // Jobs, as SPDK's perf: every worker core gets -P queue pairs on
    // every namespace of every device.
    let mut per_worker: Vec<Vec<Job>> = (0..cores.len()).map(|_| Vec::new()).collect();
    let mut per_worker_mp: Vec<Vec<MpJob>> = (0..cores.len()).map(|_| Vec::new()).collect();
    let mut written: HashMap<(usize, u32), Arc<verify::Written>> = HashMap::new();
    let mut njobs = 0usize;
    if let (Some(m), Some(plan)) = (&multipath, plans.first().and_then(|p| p.first())) {
        let io = a.run.io_size as usize;
        let depth = a.run.queue_depth as usize;
        let first = m.controller(0).ok_or(PerfError::Args("no paths".into()))?;
        let per_core = (0..a.qpairs).flat_map(|p| (0..cores.len()).map(move |w| (p, w)));
        for (p, w) in per_core {
            let mp = m.alloc_qpair(QpairOptions {
                depth: a.run.queue_depth,
                ..qopts.clone()
            })?;
            let ns = mp.namespace();
            let bufs = IoBuf::new(first.alloc_dma(depth * io)?)
                .chunks(io)
                .into_iter()
                .map(Some)
                .collect();
            let total = match a.run.io_count {
                Some(n) => n / total_jobs + u64::from((njobs as u64) < n % total_jobs),
                None => u64::MAX,
            };
            let verify = a.run.verify.then(|| {
                written
                    .entry((0, ns.nsid()))
                    .or_insert_with(|| verify::Written::new(plan.units))
                    .clone()
            });
            let label = format!(
                "multipath NSID {} ({} paths, {} {}) qpair {p} from core {}",
                ns.nsid(),
                m.len(),
                m.policy().name(),
                m.selector().name(),
                cores[w]
            );
            let ctx = job_ctx(
                &a,
                JobShape {
                    label,
                    ns,
                    bufs,
                    nlb: plan.nlb,
                    units: plan.units,
                    total,
                    seed: njobs as u64,
                    random,
                    mix,
                },
                verify,
                lat_clock,
            )?;
            per_worker_mp[w].push(MpJob {
                mp,
                ctx,
                clock: lat_clock,
                last: 0,
                max_gap: 0,
            });
            njobs += 1;
        }
    }
    for (di, (d, ns_plans)) in devices.iter().zip(&plans).enumerate() {
        for (ns, plan) in d.ctrl.namespaces().iter().zip(ns_plans) {
            let io = a.run.io_size as usize;
            let (nlb, units) = (plan.nlb, plan.units);
            let per_core = (0..a.qpairs).flat_map(|p| (0..cores.len()).map(move |w| (p, w)));
            for (p, w) in per_core {
                let qp = d.ctrl.alloc_qpair(QpairOptions {
                    depth: qpair_depth(d, a.run.queue_depth),
                    ..qopts.clone()
                })?;
                // Slots (buffers) for -q I/Os; those beyond what the
                // queue holds wait in the queue pair's backlog.
                let depth = a.run.queue_depth as usize;
                // One allocation, one owned piece per slot.
                let bufs = IoBuf::new(d.ctrl.alloc_dma(depth * io)?)
                    .chunks(io)
                    .into_iter()
                    .map(Some)
                    .collect();
                let total = match a.run.io_count {
                    Some(n) => n / total_jobs + u64::from((njobs as u64) < n % total_jobs),
                    None => u64::MAX,
                };
                let verify = a.run.verify.then(|| {
                    written
                        .entry((di, ns.nsid()))
                        .or_insert_with(|| verify::Written::new(units))
                        .clone()
                });
                let label = format!(
                    "{} NSID {} qpair {} from core {}",
                    d.name,
                    ns.nsid(),
                    p,
                    cores[w]
                );
                let ctx = job_ctx(
                    &a,
                    JobShape {
                        label,
                        ns: *ns,
                        bufs,
                        nlb,
                        units,
                        total,
                        seed: njobs as u64,
                        random,
                        mix,
                    },
                    verify,
                    lat_clock,
                )?;
                per_worker[w].push(Job { qp, ctx });
                njobs += 1;
            }
        }
    }

    let inline_devs: Vec<Arc<SoftDevice>> = if a.run.inline {
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
    let drain_timeout = Duration::from_millis(a.run.timeout_ms.max(1000).saturating_mul(2));
    // From here on, SIGINT/SIGTERM stop the run instead of the process.
    let signals = signals::StopOnSignals::install()?;
    let mut samples = Vec::new();
    let t0 = Instant::now();
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = per_worker
            .into_iter()
            .zip(per_worker_mp)
            .zip(&ctls)
            .zip(&cores)
            .map(|(((jobs, mp_jobs), ctl), &core)| {
                let inl = inline_devs.clone();
                let mode = a.mode();
                s.spawn(move || {
                    if mp_jobs.is_empty() {
                        worker::run(Some(core), jobs, inl, ctl, drain_timeout, mode)
                    } else {
                        worker::run(Some(core), mp_jobs, inl, ctl, drain_timeout, mode)
                    }
                })
            })
            .collect();
        // Status line and sample each second; stop after -t seconds.
        let mut last = 0u64;
        let mut last_t = Duration::ZERO;
        let mut tick = 1u64;
        loop {
            if handles.iter().all(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            let el = t0.elapsed();
            if signals.triggered() || (a.run.time > 0 && el >= Duration::from_secs(a.run.time)) {
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
                if !a.run.json {
                    eprintln!(
                        "[{:>4}s] {:>12.0} IOPS, {:>9.2} MiB/s{}",
                        el.as_secs(),
                        now.saturating_sub(last) as f64,
                        now.saturating_sub(last) as f64 * a.run.io_size as f64 / (1 << 20) as f64,
                        if signals.triggered() {
                            " (stopping)"
                        } else {
                            ""
                        }
                    );
                }
                samples.push(report::Sample::new(
                    el,
                    now.saturating_sub(last),
                    el - last_t,
                    a.run.io_size,
                ));
                (last, last_t) = (now, el);
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("perf worker panicked")))
            .collect()
    });

    let interrupted = signals.triggered();
    let device_stats: Vec<_> = devices
        .iter()
        .filter_map(|d| d.soft.as_ref().map(|s| (d.name.clone(), s.stats())))
        .collect();
    let summary = report::report(
        &a,
        &results,
        &device_stats,
        lat_clock.ns_per_tick(),
        lat_clock.source(),
        interrupted,
        &samples,
    );
    drop(devices);
    drop(multipath);
    drop(emu);
    drop(signals);
    Ok(summary)
}
