//! perf's summary: SPDK's table (per queue pair: IOPS, MiB/s, with -L
//! latency average/min/max, then totals and, for PCIe queue pairs,
//! emulated or not, doorbell counts; with -L the percentiles, reads and
//! writes apart for a mixed workload; with -LL a histogram per queue pair)
//! or, with `--json`, one object (with the samples taken each second).
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use super::args::{PerfArgs, PollMode};
use super::worker::WorkerResult;
use crate::common::latency::{self, HISTOGRAM_LEVEL};

/// Said where the latency columns would be, without -L.
const NOT_MEASURED: &str = "latency: not measured (no clock read per I/O); -L to measure";

/// What the caller needs after a run.
pub struct Summary {
    pub errors: u64,
}

/// What the run did in one second (or so) of it: taken by the reporting
/// loop from the workers' published I/O counts, never per I/O.
pub struct Sample {
    /// Time since the start of the run at the end of the sample.
    pub t: Duration,
    pub iops: f64,
    pub mib_s: f64,
}

impl Sample {
    /// `ios` completed over the `dt` ending at `t`, of `io_size` bytes.
    pub fn new(t: Duration, ios: u64, dt: Duration, io_size: u64) -> Sample {
        let iops = ios as f64 / dt.as_secs_f64().max(1e-9);
        Sample {
            t,
            iops,
            mib_s: iops * io_size as f64 / (1u64 << 20) as f64,
        }
    }
}

/// Latency of all I/Os and, for a mixed workload, of reads and writes
/// apart (`None` each without -L).
struct Lat<'a> {
    all: Option<&'a Histogram<u64>>,
    read_write: Option<&'a [Histogram<u64>; 2]>,
}

impl Lat<'_> {
    /// The JSON fields: all I/Os, then `read` and `write` objects.
    fn json(&self, ns_per_tick: f64, level: u8) -> serde_json::Map<String, Value> {
        let mut m = latency::json_fields(self.all, ns_per_tick, level);
        if let Some([r, w]) = self.read_write {
            for (k, h) in [("read", r), ("write", w)] {
                let f = latency::json_fields(Some(h), ns_per_tick, level);
                m.insert(k.into(), Value::Object(f));
            }
        }
        m
    }

    /// Table rows named `name`: reads and writes apart for a mixed
    /// workload (then all I/Os too if `with_all`), else all I/Os.
    fn rows<'b>(&'b self, name: &str, with_all: bool, out: &mut Vec<(String, &'b Histogram<u64>)>) {
        if let Some([r, w]) = self.read_write {
            out.push((format!("{name} reads"), r));
            out.push((format!("{name} writes"), w));
            if !with_all {
                return;
            }
        }
        if let Some(h) = self.all {
            out.push((name.to_string(), h));
        }
    }
}

pub(super) fn report(
    a: &PerfArgs,
    results: &[WorkerResult],
    device_stats: &[(String, pollux_softnvme::DeviceStats)],
    ns_per_tick: f64,
    clock_source: &str,
    interrupted: bool,
    samples: &[Sample],
) -> Summary {
    let level = a.run.latency;
    let mib = |ios: f64, io: usize| ios * io as f64 / (1u64 << 20) as f64;
    let mut rows = Vec::new();
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
    let mut max_cpu = 0f64;
    let mut cpu_total = 0f64;
    let mut hybrid = Vec::new();
    let (mut db_jobs, mut n_jobs) = (0usize, 0usize);
    // Multipath jobs: the longest gap between completions (us), and a
    // line per job for the table's report.
    let mut max_gap: Option<f64> = None;
    let mut mp_lines = Vec::new();
    for r in results {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        max_elapsed = max_elapsed.max(secs);
        let all: u64 = r.jobs.iter().map(|j| j.ios).sum::<u64>().max(1);
        let mut core_ios = 0f64;
        let mut core_err = 0u64;
        for j in &r.jobs {
            n_jobs += 1;
            // I/Os inside the measurement window, attributed by share.
            let ios_w = r.ios_in_window as f64 * j.ios as f64 / all as f64;
            let iops = ios_w / secs;
            t_ios += j.ios;
            t_err += j.errors;
            core_err += j.errors;
            core_ios += iops;
            t_iops += iops;
            t_mib += mib(iops, j.io_size);
            // Doorbells are PCIe's: TCP queue pairs count none.
            if j.doorbells {
                sq_db += j.qp.sq_doorbells;
                cq_db += j.qp.cq_doorbells;
                shadow += j.qp.shadow_updates;
                submitted += j.qp.submitted;
                db_jobs += 1;
            }
            errors_list.extend(j.first_errors.iter().map(|e| format!("{}: {e}", j.label)));
            let mut row = json!({
                "name": j.label,
                "ios": j.ios,
                "iops": iops,
                "mib_s": mib(iops, j.io_size),
                "errors": j.errors,
                "sq_doorbells": j.doorbells.then_some(j.qp.sq_doorbells),
                "cq_doorbells": j.doorbells.then_some(j.qp.cq_doorbells),
                "shadow_updates": j.doorbells.then_some(j.qp.shadow_updates),
                "polls": j.qp.polls,
                "queued": j.qp.queued,
                "timeouts": j.qp.timeouts,
            });
            let lat = Lat {
                all: j.hist.as_ref(),
                read_write: j.read_write.as_ref(),
            };
            latency::extend(&mut row, lat.json(ns_per_tick, level));
            if let Some(m) = &j.multipath {
                let gap_us = m.max_gap_ticks as f64 * ns_per_tick / 1e3;
                max_gap = Some(max_gap.unwrap_or(0f64).max(gap_us));
                row["max_completion_gap_us"] = json!(gap_us);
                row["paths"] = m
                    .paths
                    .iter()
                    .map(|(n, p)| {
                        json!({"name": n, "submitted": p.submitted, "failed_over": p.failed_over, "downs": p.downs, "ups": p.ups})
                    })
                    .collect();
                let paths: Vec<String> = m
                    .paths
                    .iter()
                    .map(|(n, p)| {
                        format!(
                            "{n}: {} sent, {} failed over, down {}x, back {}x",
                            p.submitted, p.failed_over, p.downs, p.ups
                        )
                    })
                    .collect();
                mp_lines.push(format!(
                    "{}: longest gap between completions {gap_us:.0} us; {}",
                    j.label,
                    paths.join("; ")
                ));
            }
            rows.push(row);
        }
        if let Some(e) = &r.drain_error {
            t_err += 1;
            errors_list.push(e.clone());
        }
        let cpu_util = r.cpu.as_secs_f64() / r.wall.as_secs_f64().max(1e-9);
        max_cpu = max_cpu.max(cpu_util);
        cpu_total += r.cpu.as_secs_f64();
        if let Some(h) = r.hybrid {
            hybrid.push(json!({
                "core": r.core, "min_sleep_ns": h.min_sleep_ns, "sleep_cost_ns": h.cost_ns, "mean_completion_interval_ns": h.mean_ns,
                "sleeps": h.sleeps, "skipped": h.skipped,
            }));
        }
        cores_json.push(json!({
            "core": r.core, "iops": core_ios, "seconds": secs, "errors": core_err,
            "cpu_s": r.cpu.as_secs_f64(), "cpu_util": cpu_util,
        }));
    }
    // Over the queue pairs with doorbells; None without any (TCP only).
    let per_io = |x: u64| {
        (db_jobs > 0).then(|| {
            if submitted == 0 {
                0.0
            } else {
                x as f64 / submitted as f64
            }
        })
    };
    let jobs = || results.iter().flat_map(|r| &r.jobs);
    let total_hist = latency::merged(jobs().filter_map(|j| j.hist.as_ref()));
    let total_rw = match (
        latency::merged(jobs().filter_map(|j| j.read_write.as_ref().map(|[r, _]| r))),
        latency::merged(jobs().filter_map(|j| j.read_write.as_ref().map(|[_, w]| w))),
    ) {
        (Some(r), Some(w)) => Some([r, w]),
        _ => None,
    };
    let total_lat = Lat {
        all: total_hist.as_ref(),
        read_write: total_rw.as_ref(),
    };
    let soft_json: Vec<_> = device_stats
        .iter()
        .map(|(n, s)| json!({ "name": n, "io_commands": s.io_commands, "admin_commands": s.admin_commands, "errors": s.errors, "cq_full_waits": s.cq_full_waits, "shadow_doorbell_enabled": s.shadow_doorbell_enabled, "steps": s.steps }))
        .collect();
    if a.run.json {
        let samples_json: Vec<_> = samples
            .iter()
            .map(|s| json!({"t_s": s.t.as_secs_f64(), "iops": s.iops, "mib_s": s.mib_s}))
            .collect();
        let mut out = json!({
            "config": {
                "queue_depth": a.run.queue_depth, "io_size": a.run.io_size, "workload": format!("{:?}", a.run.workload).to_lowercase(),
                "rwmixread": a.run.rwmixread(), "time_s": a.run.time, "io_count": a.run.io_count, "cores": a.cores, "qpairs_per_ns": a.qpairs,
                "inline": a.run.inline, "verify": a.run.verify, "latency": a.run.latency, "latency_clock": clock_source,
                "delayed_doorbell": !a.no_delayed_doorbell, "sq_batch": a.sq_batch, "lazy_cq": !a.no_lazy_cq,
                "prefetch": a.prefetch, "nt_copy": a.nt_copy, "cq_line_batch": a.cq_line_batch, "interrupts": a.mode() == PollMode::Interrupts, "poll_mode": a.mode().name(), "shadow_doorbell": !a.no_shadow_doorbell,
                "multipath": a.multipath.then(|| json!({"policy": a.multipath_policy, "selector": a.multipath_selector})),
            },
            "devices": rows,
            "cores": cores_json,
            "emulated_controllers": soft_json,
            "errors": errors_list,
            "interrupted": interrupted,
            "samples": samples_json,
            "total": {
                "iops": t_iops, "mib_s": t_mib, "ios": t_ios, "errors": t_err, "seconds": max_elapsed,
                "sq_doorbells_per_io": per_io(sq_db), "cq_doorbells_per_io": per_io(cq_db),
                "shadow_updates_per_io": per_io(shadow),
                "worker_cpu_util_max": max_cpu,
                // The workers' CPU time (the drain included) per I/O.
                "worker_cpu_ns_per_io": cpu_total * 1e9 / t_ios.max(1) as f64,
                "hybrid": (!hybrid.is_empty()).then_some(&hybrid),
                // Multipath: the longest interval between two polls that
                // found completions, over the jobs (the failover gap).
                "max_completion_gap_us": max_gap,
            }
        });
        latency::extend(&mut out["total"], total_lat.json(ns_per_tick, level));
        println!("{out}");
    } else {
        // The name column fits the longest name (a TCP controller's is long).
        let w = rows
            .iter()
            .map(|r| r["name"].as_str().map_or(0, |n| n.chars().count()))
            .max()
            .unwrap_or(0)
            .max(50);
        let measured = level > 0;
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        // Without -L no clock is read per I/O: one line says so where the
        // latency columns would be.
        let cells = |avg: Option<f64>, min: Option<f64>, max: Option<f64>| {
            if measured {
                format!(" {:>10} {:>10} {:>10}", f(avg), f(min), f(max))
            } else {
                String::new()
            }
        };
        let lat_head = if measured {
            format!(" {:>10} {:>10} {:>10}", "Average", "min", "max")
        } else {
            format!("   {NOT_MEASURED}")
        };
        let head = format!(
            "{:<w$}: {:>12} {:>10}{lat_head}",
            "Device Information", "IOPS", "MiB/s"
        );
        // As wide as the header, the note without -L included.
        let bar = "=".repeat(head.chars().count().max(w + 60));
        println!("{bar}");
        if measured {
            println!("{:<w$}{:>48}", "", "Latency(us)", w = w + 12);
        }
        println!("{head}");
        for r in &rows {
            println!(
                "{:<w$}: {:>12.2} {:>10.2}{}",
                r["name"].as_str().unwrap_or(""),
                r["iops"].as_f64().unwrap_or(0.0),
                r["mib_s"].as_f64().unwrap_or(0.0),
                cells(
                    r["avg_lat_us"].as_f64(),
                    r["min_lat_us"].as_f64(),
                    r["max_lat_us"].as_f64()
                )
            );
        }
        println!("{bar}");
        let t = total_hist
            .as_ref()
            .map(|h| latency::Stats::of(h, ns_per_tick));
        println!(
            "{:<w$}: {:>12.2} {:>10.2}{}",
            "Total",
            t_iops,
            t_mib,
            cells(
                t.as_ref().map(|s| s.avg),
                t.as_ref().map(|s| s.min),
                t.as_ref().map(|s| s.max)
            )
        );
        if measured {
            let mut table = Vec::new();
            let job_lats: Vec<_> = jobs()
                .map(|j| {
                    let l = Lat {
                        all: j.hist.as_ref(),
                        read_write: j.read_write.as_ref(),
                    };
                    (j.label.as_str(), l)
                })
                .collect();
            for (name, l) in &job_lats {
                l.rows(name, false, &mut table);
            }
            let per_job = table.len();
            total_lat.rows("Total", true, &mut table);
            let width = table
                .iter()
                .map(|(n, _)| n.chars().count())
                .max()
                .unwrap_or(0)
                .max(50);
            println!();
            latency::print_table(&table, ns_per_tick, width);
            if level >= HISTOGRAM_LEVEL {
                println!();
                for (name, h) in &table[..per_job] {
                    latency::print_histogram(name, h, ns_per_tick);
                }
            }
        }
        if let (Some(sq), Some(cq), Some(sh)) = (per_io(sq_db), per_io(cq_db), per_io(shadow)) {
            println!(
                "Doorbell writes per I/O{}: SQ {sq:.4}  CQ {cq:.4}  (shadow updates {sh:.4})",
                if db_jobs < n_jobs {
                    " (PCIe and emulated controllers)"
                } else {
                    ""
                }
            );
        }
        println!("I/Os: {t_ios}  errors: {t_err}");
        for l in &mp_lines {
            println!("{l}");
        }
        if interrupted {
            println!("Stopped early by a signal.");
        }
        println!(
            "Worker CPU: {:.1}% of a core (busiest worker, getrusage), {:.0} ns per I/O{}",
            max_cpu * 100.0,
            cpu_total * 1e9 / t_ios.max(1) as f64,
            match a.mode() {
                PollMode::Interrupts => "; sleeping on interrupts when idle",
                PollMode::Hybrid => "; hybrid polling",
                PollMode::Polled => "; polling",
            }
        );
        for r in results {
            if let Some(h) = r.hybrid {
                println!(
                    "Hybrid polling{}: a 1 ns sleep took {} ns here, a sleep's overshoot at the end {} ns; mean time between completions {} ns; {} sleeps, {} skipped (half the mean too short to sleep)",
                    r.core.map(|c| format!(" on core {c}")).unwrap_or_default(),
                    h.min_sleep_ns,
                    h.cost_ns,
                    h.mean_ns,
                    h.sleeps,
                    h.skipped
                );
            }
        }
        for e in &errors_list {
            println!("error: {e}");
        }
    }
    Summary { errors: t_err }
}
