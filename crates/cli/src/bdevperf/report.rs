//! bdevperf's summary: SPDK's table (per job: runtime, IOPS, MiB/s,
//! Fail/s, TO/s, latency average/min/max) or, with `--json`, one object
//! shaped like `pollux perf --json`'s.
use std::collections::HashMap;

use hdrhistogram::Histogram;
use pollux_bdev::{Bdev, BdevStats};
use serde_json::{json, Value};

use super::args::BdevperfArgs;
use super::job::JobResult;
use crate::common::cores::mask_of;
use crate::common::latency::{self, HISTOGRAM_LEVEL};

/// What the caller needs after a run.
pub struct Summary {
    pub errors: u64,
}

/// One job's place: its bdev and core, for the report.
pub struct JobMeta {
    pub bdev: String,
    pub core: usize,
}

/// A latency statistic in microseconds: `q` a quantile, `None` the mean.
fn lat_us(h: &Histogram<u64>, q: Option<f64>, ns_per_tick: f64) -> f64 {
    let ticks = match q {
        Some(q) => h.value_at_quantile(q) as f64,
        None => h.mean(),
    };
    ticks * ns_per_tick / 1000.0
}

#[allow(clippy::too_many_arguments)]
pub fn report(
    a: &BdevperfArgs,
    cores: &[usize],
    metas: &[JobMeta],
    results: &[Option<JobResult>],
    bdevs: &[Bdev],
    stats: &HashMap<String, BdevStats>,
    ns_per_tick: f64,
    clock_source: &str,
    interrupted: bool,
) -> Summary {
    let us = |ticks: u64| ticks as f64 * ns_per_tick / 1000.0;
    let mib = |iops: f64| iops * a.run.io_size as f64 / (1u64 << 20) as f64;
    let mut rows: Vec<Value> = Vec::new();
    let mut errors_list: Vec<String> = Vec::new();
    let mut total_hist: Option<Histogram<u64>> = None;
    let (mut t_ios, mut t_err, mut t_iops, mut t_to, mut t_fail_s, mut t_to_s, mut max_secs) =
        (0u64, 0u64, 0f64, 0u64, 0f64, 0f64, 0f64);
    let mut per_core: HashMap<usize, (f64, u64, f64, f64)> = HashMap::new();
    for (m, r) in metas.iter().zip(results) {
        let Some(r) = r else {
            // Its thread ended without a result (drain timeout, panic).
            t_err += 1;
            errors_list.push(format!(
                "{} on core {}: the job did not report (its thread ended first)",
                m.bdev, m.core
            ));
            rows.push(json!({"name": m.bdev, "core": m.core, "reported": false}));
            continue;
        };
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        max_secs = max_secs.max(secs);
        let iops = r.ios_in_window as f64 / secs;
        let fail_s = r.errors as f64 / secs;
        let to_s = r.timeouts as f64 / secs;
        t_ios += r.ios;
        t_err += r.errors;
        t_iops += iops;
        t_to += r.timeouts;
        t_fail_s += fail_s;
        t_to_s += to_s;
        let c = per_core.entry(m.core).or_default();
        c.0 += iops;
        c.1 += r.errors;
        c.2 = c.2.max(r.cpu.as_secs_f64());
        c.3 = c.3.max(r.wall.as_secs_f64());
        errors_list.extend(
            r.first_errors
                .iter()
                .map(|e| format!("{} on core {}: {e}", m.bdev, m.core)),
        );
        if let Some(h) = &r.hist {
            match &mut total_hist {
                None => total_hist = Some(h.clone()),
                Some(t) => {
                    let _ = t.add(h);
                }
            }
        }
        let mut row = json!({
            "name": m.bdev,
            "core": m.core,
            "core_mask": mask_of(&[m.core]),
            "runtime_s": secs,
            "ios": r.ios,
            "iops": iops,
            "mib_s": mib(iops),
            "errors": r.errors,
            "fail_s": fail_s,
            "timeouts": r.timeouts,
            "to_s": to_s,
            "polls": r.polls,
        });
        let lat = latency::json_fields(r.hist.as_ref(), ns_per_tick, a.run.latency);
        latency::extend(&mut row, lat);
        rows.push(row);
    }
    let lat = |q: Option<f64>| total_hist.as_ref().map(|h| lat_us(h, q, ns_per_tick));
    let workload = format!("{:?}", a.run.workload).to_lowercase();
    if a.run.json {
        let mut cores_json: Vec<_> = per_core
            .iter()
            .map(|(core, (iops, err, cpu, wall))| {
                json!({"core": core, "iops": iops, "errors": err, "cpu_s": cpu,
                       "cpu_util": cpu / wall.max(1e-9)})
            })
            .collect();
        cores_json.sort_by_key(|c| c["core"].as_u64());
        let bdevs_json: Vec<_> = bdevs
            .iter()
            .map(|b| {
                let i = b.info();
                let s = stats.get(b.name()).cloned().unwrap_or_default();
                json!({"name": i.name, "backend": i.backend, "block_size": i.block_size,
                       "num_blocks": i.num_blocks, "uuid": i.uuid_string(),
                       "reads": s.reads, "writes": s.writes, "read_bytes": s.read_bytes,
                       "write_bytes": s.write_bytes, "errors": s.errors})
            })
            .collect();
        let mut out = json!({
            "config": {
                "queue_depth": a.run.queue_depth, "io_size": a.run.io_size, "workload": workload,
                "rwmixread": a.run.rwmixread(), "time_s": a.run.time, "io_count": a.run.io_count,
                "core_mask": mask_of(cores), "cores": cores, "every_core": a.every_core,
                "inline": a.run.inline, "verify": a.run.verify, "latency": a.run.latency,
                "latency_clock": clock_source,
            },
            "bdevs": bdevs_json,
            "jobs": rows,
            "cores": cores_json,
            "errors": errors_list,
            "interrupted": interrupted,
            "total": {
                "iops": t_iops, "mib_s": mib(t_iops), "ios": t_ios, "errors": t_err,
                "fail_s": t_fail_s, "timeouts": t_to, "to_s": t_to_s, "seconds": max_secs,
            }
        });
        let lat = latency::json_fields(total_hist.as_ref(), ns_per_tick, a.run.latency);
        latency::extend(&mut out["total"], lat);
        println!("{out}");
    } else {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!("{:>118}", "Latency(us)");
        println!(
            "{:<30}: {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "Device Information",
            "runtime(s)",
            "IOPS",
            "MiB/s",
            "Fail/s",
            "TO/s",
            "Average",
            "min",
            "max"
        );
        for r in &rows {
            let name = r["name"].as_str().unwrap_or("");
            let core = r["core"].as_u64().unwrap_or(0) as usize;
            println!("Job: {name} (Core Mask {})", mask_of(&[core]));
            println!(
                "\t workload: {workload}, depth: {}, IO size: {}",
                a.run.queue_depth, a.run.io_size
            );
            if r["reported"] == false {
                println!("\t {name:<22}: did not report");
                continue;
            }
            let g = |k: &str| r[k].as_f64().unwrap_or(0.0);
            println!(
                "\t {:<22}: {:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10} {:>10} {:>10}",
                name,
                g("runtime_s"),
                g("iops"),
                g("mib_s"),
                g("fail_s"),
                g("to_s"),
                f(r["avg_lat_us"].as_f64()),
                f(r["min_lat_us"].as_f64()),
                f(r["max_lat_us"].as_f64()),
            );
        }
        println!("{}", "=".repeat(118));
        println!(
            "{:<30}: {:>10} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10} {:>10} {:>10}",
            "Total",
            "",
            t_iops,
            mib(t_iops),
            t_fail_s,
            t_to_s,
            f(lat(None)),
            f(total_hist.as_ref().map(|h| us(h.min()))),
            f(total_hist.as_ref().map(|h| us(h.max()))),
        );
        if let (true, Some(h)) = (a.run.latency > 0, &total_hist) {
            println!();
            latency::print_table(&[("Total".into(), h)], ns_per_tick, 30);
            if a.run.latency >= HISTOGRAM_LEVEL {
                println!();
                latency::print_histogram("all jobs", h, ns_per_tick);
            }
        }
        println!("I/Os: {t_ios}  errors: {t_err}  timeouts: {t_to}");
        if interrupted {
            println!("Stopped early by a signal.");
        }
        for e in &errors_list {
            println!("error: {e}");
        }
    }
    Summary { errors: t_err }
}
