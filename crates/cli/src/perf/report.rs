//! perf's summary: SPDK's table (per queue pair: IOPS, MiB/s, latency
//! average/min/max, then totals and, for PCIe queue pairs, emulated or
//! not, doorbell counts) or, with `--json`, one object.
use hdrhistogram::Histogram;
use serde_json::json;

use super::args::PerfArgs;
use super::worker::WorkerResult;

/// What the caller needs after a run.
pub struct Summary {
    pub errors: u64,
}

/// A latency statistic in microseconds: `q` a quantile, `None` the mean.
fn lat_us(h: &Histogram<u64>, q: Option<f64>, ns_per_tick: f64) -> f64 {
    let ticks = match q {
        Some(q) => h.value_at_quantile(q) as f64,
        None => h.mean(),
    };
    ticks * ns_per_tick / 1000.0
}

pub(super) fn report(
    a: &PerfArgs,
    results: &[WorkerResult],
    device_stats: &[(String, pollux_softnvme::DeviceStats)],
    ns_per_tick: f64,
    clock_source: &str,
    interrupted: bool,
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
    let mut max_cpu = 0f64;
    let (mut db_jobs, mut jobs) = (0usize, 0usize);
    for r in results {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        max_elapsed = max_elapsed.max(secs);
        let all: u64 = r.jobs.iter().map(|j| j.ios).sum::<u64>().max(1);
        let mut core_ios = 0f64;
        let mut core_err = 0u64;
        for j in &r.jobs {
            jobs += 1;
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
                "sq_doorbells": j.doorbells.then_some(j.qp.sq_doorbells),
                "cq_doorbells": j.doorbells.then_some(j.qp.cq_doorbells),
                "shadow_updates": j.doorbells.then_some(j.qp.shadow_updates),
                "polls": j.qp.polls,
                "queued": j.qp.queued,
                "timeouts": j.qp.timeouts,
            }));
        }
        if let Some(e) = &r.drain_error {
            t_err += 1;
            errors_list.push(e.clone());
        }
        let cpu_util = r.cpu.as_secs_f64() / r.wall.as_secs_f64().max(1e-9);
        max_cpu = max_cpu.max(cpu_util);
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
    let lat = |q: Option<f64>| total_hist.as_ref().map(|h| lat_us(h, q, ns_per_tick));
    let soft_json: Vec<_> = device_stats
        .iter()
        .map(|(n, s)| json!({ "name": n, "io_commands": s.io_commands, "admin_commands": s.admin_commands, "errors": s.errors, "cq_full_waits": s.cq_full_waits, "shadow_doorbell_enabled": s.shadow_doorbell_enabled }))
        .collect();
    if a.run.json {
        let out = json!({
            "config": {
                "queue_depth": a.run.queue_depth, "io_size": a.run.io_size, "workload": format!("{:?}", a.run.workload).to_lowercase(),
                "rwmixread": a.run.rwmixread(), "time_s": a.run.time, "io_count": a.run.io_count, "cores": a.cores, "qpairs_per_ns": a.qpairs,
                "inline": a.run.inline, "verify": a.run.verify, "latency": a.run.latency, "latency_clock": clock_source,
                "delayed_doorbell": !a.no_delayed_doorbell, "sq_batch": a.sq_batch, "lazy_cq": !a.no_lazy_cq,
                "prefetch": a.prefetch, "nt_copy": a.nt_copy, "cq_line_batch": a.cq_line_batch, "interrupts": a.interrupts, "shadow_doorbell": !a.no_shadow_doorbell,
            },
            "devices": rows,
            "cores": cores_json,
            "emulated_controllers": soft_json,
            "errors": errors_list,
            "interrupted": interrupted,
            "total": {
                "iops": t_iops, "mib_s": t_mib, "ios": t_ios, "errors": t_err, "seconds": max_elapsed,
                "avg_lat_us": lat(None), "min_lat_us": total_hist.as_ref().map(|h| us(h.min())),
                "p50_lat_us": lat(Some(0.5)), "p99_lat_us": lat(Some(0.99)),
                "max_lat_us": total_hist.as_ref().map(|h| us(h.max())),
                "sq_doorbells_per_io": per_io(sq_db), "cq_doorbells_per_io": per_io(cq_db),
                "shadow_updates_per_io": per_io(shadow),
                "worker_cpu_util_max": max_cpu,
            }
        });
        println!("{out}");
    } else {
        // The name column fits the longest name (a TCP controller's is long).
        let w = rows
            .iter()
            .map(|r| r["name"].as_str().map_or(0, |n| n.chars().count()))
            .max()
            .unwrap_or(0)
            .max(50);
        let bar = "=".repeat(w + 60);
        println!("{bar}");
        println!("{:<w$}{:>48}", "", "Latency(us)", w = w + 12);
        println!(
            "{:<w$}: {:>12} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        for r in &rows {
            let f = |k: &str| r[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
            println!(
                "{:<w$}: {:>12.2} {:>10.2} {:>10} {:>10} {:>10}",
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
            "{:<w$}: {:>12.2} {:>10.2} {:>10} {:>10} {:>10}",
            "Total",
            t_iops,
            t_mib,
            fmt(lat(None)),
            fmt(total_hist.as_ref().map(|h| us(h.min()))),
            fmt(total_hist.as_ref().map(|h| us(h.max())))
        );
        if a.run.latency {
            println!(
                "Latency percentiles (us): p50 {}  p99 {}",
                fmt(lat(Some(0.5))),
                fmt(lat(Some(0.99)))
            );
        }
        if let (Some(sq), Some(cq), Some(sh)) = (per_io(sq_db), per_io(cq_db), per_io(shadow)) {
            println!(
                "Doorbell writes per I/O{}: SQ {sq:.4}  CQ {cq:.4}  (shadow updates {sh:.4})",
                if db_jobs < jobs {
                    " (PCIe and emulated controllers)"
                } else {
                    ""
                }
            );
        }
        println!("I/Os: {t_ios}  errors: {t_err}");
        if interrupted {
            println!("Stopped early by a signal.");
        }
        println!(
            "Worker CPU: {:.1}% of a core (busiest worker, getrusage){}",
            max_cpu * 100.0,
            if a.interrupts {
                "; sleeping on interrupts when idle"
            } else {
                "; polling"
            }
        );
        for e in &errors_list {
            println!("error: {e}");
        }
    }
    Summary { errors: t_err }
}
