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
    notes: &[String],
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
            "notes": notes,
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
        let total = [
            String::new(),
            format!("{t_iops:.2}"),
            format!("{:.2}", mib(t_iops)),
            format!("{t_fail_s:.2}"),
            format!("{t_to_s:.2}"),
            f(lat(None)),
            f(total_hist.as_ref().map(|h| us(h.min()))),
            f(total_hist.as_ref().map(|h| us(h.max()))),
        ];
        let head = format!(
            "workload: {workload}, depth: {}, IO size: {}",
            a.run.queue_depth, a.run.io_size
        );
        print!("{}", table(&head, &table_rows(&rows), &total));
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
        for n in notes {
            println!("note: {n}");
        }
        for e in &errors_list {
            println!("error: {e}");
        }
    }
    Summary { errors: t_err }
}

/// One job's row of the text table: its cells, `None` if it did not
/// report.
struct TableRow {
    name: String,
    core: usize,
    cells: Option<[String; 8]>,
}

/// The table rows of the jobs' JSON rows.
fn table_rows(rows: &[Value]) -> Vec<TableRow> {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    rows.iter()
        .map(|r| {
            let g = |k: &str| r[k].as_f64().unwrap_or(0.0);
            TableRow {
                name: r["name"].as_str().unwrap_or("").to_string(),
                core: r["core"].as_u64().unwrap_or(0) as usize,
                cells: (r["reported"] != false).then(|| {
                    [
                        format!("{:.2}", g("runtime_s")),
                        format!("{:.2}", g("iops")),
                        format!("{:.2}", g("mib_s")),
                        format!("{:.2}", g("fail_s")),
                        format!("{:.2}", g("to_s")),
                        f(r["avg_lat_us"].as_f64()),
                        f(r["min_lat_us"].as_f64()),
                        f(r["max_lat_us"].as_f64()),
                    ]
                }),
            }
        })
        .collect()
}

/// Where SPDK's `"\t "` put a job's name (a tab stop of 8, plus one), in
/// spaces so that the columns line up whatever the tab width.
const INDENT: &str = "         ";
/// The figures' headings, and their narrowest widths.
const HEADS: [&str; 8] = [
    "runtime(s)",
    "IOPS",
    "MiB/s",
    "Fail/s",
    "TO/s",
    "Average",
    "min",
    "max",
];
const MIN_WIDTHS: [usize; 8] = [10, 12, 10, 10, 10, 10, 10, 10];
/// The narrowest name column (SPDK's).
const MIN_LABEL: usize = 30;

/// SPDK's table: a header, per job its name and core, `head` (workload,
/// depth, I/O size) and its figures, then the `total` row. The name
/// column is as wide as the longest job name needs, each figure's as
/// wide as its widest cell: every row's columns start at the same
/// offsets.
fn table(head: &str, rows: &[TableRow], total: &[String; 8]) -> String {
    use std::fmt::Write;
    let len = |s: &str| s.chars().count();
    let label = rows
        .iter()
        .map(|r| INDENT.len() + len(&r.name) + 1)
        .chain([MIN_LABEL, len("Device Information")])
        .max()
        .unwrap_or(MIN_LABEL);
    let mut w = MIN_WIDTHS;
    for cells in rows.iter().filter_map(|r| r.cells.as_ref()).chain([total]) {
        for (w, c) in w.iter_mut().zip(cells.iter()) {
            *w = (*w).max(len(c));
        }
    }
    for (w, h) in w.iter_mut().zip(HEADS) {
        *w = (*w).max(len(h));
    }
    let line = |o: &mut String, name: &str, cells: &[&str; 8]| {
        let _ = write!(o, "{name:<label$}:");
        for (c, w) in cells.iter().zip(w) {
            let _ = write!(o, " {c:>w$}");
        }
        o.push('\n');
    };
    let width = label + 1 + w.iter().map(|w| w + 1).sum::<usize>();
    let mut o = String::new();
    // "Latency(us)" ends where the latency columns (the last three) end.
    let _ = writeln!(o, "{:>width$}", "Latency(us)");
    line(&mut o, "Device Information", &HEADS);
    for r in rows {
        let name = &r.name;
        let _ = writeln!(o, "Job: {name} (Core Mask {})", mask_of(&[r.core]));
        let _ = writeln!(o, "{INDENT}{head}");
        let indented = format!("{INDENT}{name}");
        match &r.cells {
            Some(c) => line(&mut o, &indented, &c.each_ref().map(String::as_str)),
            None => {
                let _ = writeln!(o, "{indented:<label$}: did not report");
            }
        }
    }
    let _ = writeln!(o, "{}", "=".repeat(width));
    line(&mut o, "Total", &total.each_ref().map(String::as_str));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, core: usize, iops: &str) -> TableRow {
        let mut cells: [String; 8] = std::array::from_fn(|_| "1.00".to_string());
        cells[1] = iops.to_string();
        TableRow {
            name: name.to_string(),
            core,
            cells: Some(cells),
        }
    }

    /// The character offsets at which the cells of a figures line end,
    /// the `:` after the name column first.
    fn column_ends(line: &str, colon: usize) -> Vec<usize> {
        let c: Vec<char> = line.chars().collect();
        assert_eq!(c.get(colon), Some(&':'), "no ':' at {colon}: {line:?}");
        let mut ends = vec![colon];
        for i in colon + 1..c.len() {
            if c[i] != ' ' && c.get(i + 1).is_none_or(|&n| n == ' ') {
                ends.push(i);
            }
        }
        ends
    }

    /// The header, every job's figures and the total: their columns end
    /// at the same offsets, and no tab makes that depend on the terminal.
    fn assert_aligned(t: &str, jobs: usize) {
        assert!(!t.contains('\t'), "{t}");
        let lines: Vec<&str> = t.lines().collect();
        let header = lines
            .iter()
            .find(|l| l.starts_with("Device Information"))
            .unwrap();
        let colon = header.find(':').unwrap();
        let want = column_ends(header, colon);
        assert_eq!(want.len(), 9, "{header}");
        let figures: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(INDENT) && !l.contains("workload:") && !l.ends_with("(us)"))
            .collect();
        assert_eq!(figures.len(), jobs, "{t}");
        for l in figures
            .into_iter()
            .chain(lines.iter().filter(|l| l.starts_with("Total")))
        {
            if l.ends_with("did not report") {
                assert_eq!(l.chars().nth(colon), Some(':'), "{t}");
                continue;
            }
            assert_eq!(column_ends(l, colon), want, "misaligned:\n{t}");
        }
        let rule = lines.iter().find(|l| l.starts_with("===")).unwrap();
        assert_eq!(rule.len(), header.len(), "{t}");
        assert_eq!(lines[0].len(), header.len(), "{t}");
    }

    #[test]
    fn columns_line_up_with_short_names() {
        let rows = [row("Nvme0n1", 0, "128942.01"), row("Malloc0", 1, "1.00")];
        let t = table(
            "workload: verify",
            &rows,
            &std::array::from_fn(|_| "2.00".into()),
        );
        assert_aligned(&t, 2);
        // SPDK's widths when nothing is longer: the name column of 30.
        assert!(
            t.contains("Device Information            : runtime(s)"),
            "{t}"
        );
    }

    #[test]
    fn columns_line_up_with_long_names_and_wide_figures() {
        let tcp = "NvmeTcp_nqn.2014-08.org.nvmexpress:uuid:0f6a9e54-2b0e-4f3c-9d1e-7a7f5a1b2c3dn1";
        let uring = "Uring_/very/long/path/to/a/file/on/a/disk/that/has/a/long/name.img";
        let mut failed = row("Null0", 0, "1.00");
        failed.cells = None;
        let rows = [
            row(tcp, 0, "1.00"),
            row("Nvme0n1", 1, "123456789012345.00"),
            failed,
            row(uring, 1, "5.00"),
        ];
        let total: [String; 8] = std::array::from_fn(|_| "99999999999999999.99".into());
        let t = table("workload: randread", &rows, &total);
        assert_aligned(&t, 4);
        assert!(t.contains(&format!("{INDENT}{tcp} :")), "{t}");
    }
}
