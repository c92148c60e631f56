//! `pollux perf` end to end: the binary as a user runs it. Inline mode (the
//! emulated controller stepped by the worker) and --io-count keep every run
//! short and its counts exact.

use serde_json::Value;

mod common;
use common::pollux;

/// The first CPU this process may not run on.
fn unavailable_core() -> usize {
    let allowed = common::allowed_cores();
    (0..)
        .find(|c| !allowed.contains(c))
        .expect("a CPU outside the affinity mask")
}

fn perf_json(args: &[&str]) -> (i32, Value) {
    let mut a = vec!["perf", "--json"];
    a.extend_from_slice(args);
    let (code, out, err) = pollux(&a);
    let v: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\nstderr: {err}"));
    (code, v)
}

#[test]
fn io_count_inline_is_exact_and_reports_the_fields() {
    let (code, v) = perf_json(&[
        "--inline",
        "-t",
        "0",
        "--io-count",
        "5000",
        "-q",
        "32",
        "-w",
        "randread",
    ]);
    assert_eq!(code, 0);
    let t = &v["total"];
    assert_eq!(t["ios"], 5000);
    assert_eq!(t["errors"], 0);
    for k in [
        "iops",
        "mib_s",
        "sq_doorbells_per_io",
        "cq_doorbells_per_io",
        "seconds",
    ] {
        assert!(t[k].as_f64().is_some(), "total.{k} missing: {t}");
    }
    assert!(t["iops"].as_f64().unwrap() > 0.0);
    // Without -L no latency is measured.
    assert!(t["avg_lat_us"].is_null());
    assert_eq!(v["interrupted"], false);
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v["cores"].as_array().unwrap().len(), 1);
    // Delayed doorbell + lazy CQ: far fewer doorbells than I/Os even here.
    assert!(t["shadow_updates_per_io"].as_f64().unwrap() < 0.5);
}

#[test]
fn verify_passes_on_ram_for_every_pattern() {
    for w in ["randwrite", "write", "randrw", "rw"] {
        let (code, v) = perf_json(&[
            "--inline",
            "-t",
            "0",
            "--io-count",
            "4000",
            "-q",
            "16",
            "-o",
            "8k",
            "-w",
            w,
            "--verify",
            "-r",
            "trtype:soft backend:ram size:4MiB lbads:512",
        ]);
        assert_eq!(code, 0, "{w}: {v}");
        assert_eq!(v["total"]["errors"], 0, "{w}");
        assert_eq!(v["total"]["ios"], 4000, "{w}");
    }
}

/// Blocks that hold neither zeros nor their tag (a file full of 0xA5, never
/// written by this run) must fail verification: this is what shows --verify
/// can fail.
#[test]
fn verify_fails_on_foreign_data_and_names_the_lba() {
    let dir = std::env::temp_dir().join(format!("pollux-perf-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("disk.img");
    std::fs::write(&f, vec![0xA5u8; 64 << 10]).unwrap();
    let trid = format!("trtype:soft backend:file path:{} size:64KiB", f.display());
    let (code, v) = perf_json(&[
        "--inline",
        "-t",
        "0",
        "--io-count",
        "100",
        "-q",
        "8",
        "-w",
        "randread",
        "--verify",
        "-r",
        &trid,
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1, "errors must give exit status 1: {v}");
    assert_eq!(v["total"]["errors"], 100, "every read fails: {v}");
    let first = v["errors"][0].as_str().unwrap();
    assert!(
        first.contains("verify: LBA ") && first.contains("tag mismatch"),
        "{first}"
    );
}

/// The null backend keeps no data, so --verify there would report false
/// corruption: it is refused before the run.
#[test]
fn verify_on_null_backend_is_refused() {
    for args in [
        &["perf", "--inline", "-t", "1", "--verify"][..],
        &[
            "perf",
            "--inline",
            "-t",
            "1",
            "--verify",
            "-r",
            "trtype:soft backend:null size:64KiB",
        ][..],
    ] {
        let (code, out, err) = pollux(args);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        assert!(
            err.contains("--verify") && err.contains("backend:null") && err.contains("backend:ram"),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "no run: {out}");
    }
}

/// A submission the driver refuses (here: 1 MiB at QD 1 needs more commands
/// than the queue pair has slots, with the emulated controller's 128 KiB
/// MDTS) is a finished I/O with an error: the run ends (it used to wait
/// forever for the slot's completion) and exits non-zero. A driver that
/// splits such an I/O and waits for free slots runs it instead: then it
/// must succeed exactly.
#[test]
fn refused_submission_ends_the_run() {
    for extra in [&[][..], &["--inline"][..]] {
        let mut args = vec!["-q", "1", "-o", "1m", "-t", "0", "--io-count", "10"];
        args.extend_from_slice(extra);
        let (code, v) = perf_json(&args);
        let t = &v["total"];
        if code == 0 {
            assert_eq!(
                (t["ios"].as_u64(), t["errors"].as_u64()),
                (Some(10), Some(0)),
                "{v}"
            );
        } else {
            assert_eq!(code, 1, "{v}");
            let ios = t["ios"].as_u64().unwrap();
            assert!(ios >= 1 && t["errors"].as_u64() >= Some(ios), "{v}");
            let first = v["errors"][0].as_str().unwrap();
            assert!(first.contains("submit at LBA"), "{first}");
        }
    }
}

/// A small-MDTS drive (8 KiB, `mdts:1`) at queue depth 1 with 1 MiB I/O:
/// each request is 128 commands that wait for the one tracker, and the data
/// is verified. Before, the driver refused it ("needs 128 commands but the
/// queue pair only has 1 slots").
#[test]
fn one_mib_at_qd1_on_a_small_mdts_drive_moves_data() {
    for extra in [&[][..], &["--inline"][..]] {
        let mut args = vec![
            "-r",
            "trtype:soft backend:ram size:64MiB mdts:1 mqes:3",
            "-q",
            "1",
            "-o",
            "1m",
            "-w",
            "randrw",
            "--verify",
            "-t",
            "0",
            "--io-count",
            "20",
        ];
        args.extend_from_slice(extra);
        let (code, v) = perf_json(&args);
        assert_eq!(code, 0, "{v}");
        let t = &v["total"];
        assert_eq!(
            (t["ios"].as_u64(), t["errors"].as_u64()),
            (Some(20), Some(0)),
            "{v}"
        );
    }
    // mqes:3: queues of 4 entries hold 3 commands; -q 8 still runs, 5
    // I/Os waiting in software, and stderr says so once.
    let (code, out, err) = pollux(&[
        "perf",
        "-r",
        "trtype:soft backend:ram size:64MiB mqes:3",
        "-q",
        "8",
        "-w",
        "randrw",
        "--verify",
        "-t",
        "0",
        "--io-count",
        "400",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("perf --json");
    assert_eq!(v["total"]["ios"], 400, "{out}");
    assert_eq!(v["total"]["errors"], 0, "{out}");
    assert_eq!(err.matches("hold 3 commands").count(), 1, "{err}");
    assert!(err.contains("-q 8 keeps the other 5 waiting"), "{err}");
}

/// `--interrupts`: the worker sleeps on the queue pairs' interrupts when a
/// poll finds nothing; data still verified, CPU use reported; refused with
/// `--inline`, where nothing runs the device while the worker sleeps.
#[test]
fn interrupts_mode_moves_verified_data_and_reports_cpu() {
    let (code, v) = perf_json(&[
        "-r",
        "trtype:soft backend:ram size:16MiB",
        "--interrupts",
        "-q",
        "2",
        "-w",
        "randrw",
        "--verify",
        "-L",
        "-t",
        "0",
        "--io-count",
        "3000",
    ]);
    assert_eq!(code, 0, "{v}");
    let t = &v["total"];
    assert_eq!(
        (t["ios"].as_u64(), t["errors"].as_u64()),
        (Some(3000), Some(0)),
        "{v}"
    );
    assert_eq!(v["config"]["interrupts"], true);
    let cpu = t["worker_cpu_util_max"].as_f64().unwrap();
    assert!(cpu > 0.0 && cpu.is_finite(), "{v}");
    let (code, _out, err) = pollux(&["perf", "--inline", "--interrupts", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--interrupts"), "{err}");
}

/// `--poll-mode hybrid`: the worker sleeps about half the mean time
/// between completions after a poll that finds nothing; data still
/// verified, its sleeps reported. `--poll-mode interrupts` is
/// `--interrupts`; hybrid is refused with `--inline` (nothing would run
/// the device while the worker sleeps) and `--poll-mode` with
/// `--interrupts`.
#[test]
fn hybrid_mode_moves_verified_data_and_reports_its_sleeps() {
    for mode in ["hybrid", "interrupts", "polled"] {
        let (code, v) = perf_json(&[
            "-r",
            "trtype:soft backend:ram size:16MiB",
            "--poll-mode",
            mode,
            "-q",
            "1",
            "-w",
            "randrw",
            "--verify",
            "-L",
            "-t",
            "0",
            "--io-count",
            "3000",
        ]);
        assert_eq!(code, 0, "{v}");
        let t = &v["total"];
        assert_eq!(
            (t["ios"].as_u64(), t["errors"].as_u64()),
            (Some(3000), Some(0)),
            "{mode}: {v}"
        );
        assert_eq!(v["config"]["poll_mode"], mode, "{v}");
        assert_eq!(v["config"]["interrupts"], mode == "interrupts", "{v}");
        let cpu = t["worker_cpu_ns_per_io"].as_f64().unwrap();
        assert!(cpu > 0.0 && cpu.is_finite(), "{v}");
        if mode == "hybrid" {
            let h = &t["hybrid"][0];
            assert!(h["min_sleep_ns"].as_u64().unwrap() > 0, "{v}");
            // Once per completion at most: a sleep or a skip.
            let (sl, sk) = (
                h["sleeps"].as_u64().unwrap(),
                h["skipped"].as_u64().unwrap(),
            );
            assert!(sl + sk <= 3000, "{v}");
        } else {
            assert!(t["hybrid"].is_null(), "{v}");
        }
    }
    let (code, _out, err) = pollux(&["perf", "--inline", "--poll-mode", "hybrid", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--poll-mode hybrid") && err.contains("--inline"),
        "{err}"
    );
    let (code, _out, err) = pollux(&["perf", "--interrupts", "--poll-mode", "hybrid", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--poll-mode"), "{err}");
    let (code, _out, err) = pollux(&["perf", "--poll-mode", "sometimes", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("sometimes"), "{err}");
}

#[test]
fn latency_fields_with_dash_l() {
    let (code, v) = perf_json(&["--inline", "-t", "0", "--io-count", "2000", "-q", "4", "-L"]);
    assert_eq!(code, 0);
    let t = &v["total"];
    let (min, avg, p50, p99, max) = (
        t["min_lat_us"].as_f64().unwrap(),
        t["avg_lat_us"].as_f64().unwrap(),
        t["p50_lat_us"].as_f64().unwrap(),
        t["p99_lat_us"].as_f64().unwrap(),
        t["max_lat_us"].as_f64().unwrap(),
    );
    assert!(
        min > 0.0 && min <= p50 && p50 <= p99 && p99 <= max && min <= avg && avg <= max,
        "{t}"
    );
}

#[test]
fn several_queue_pairs_and_namespaces() {
    let (code, v) = perf_json(&[
        "--inline",
        "-t",
        "0",
        "--io-count",
        "6000",
        "-q",
        "8",
        "-P",
        "3",
        "-w",
        "randwrite",
        "--verify",
        "-r",
        "trtype:soft backend:ram size:1MiB lbads:4096 ns:2",
    ]);
    assert_eq!(code, 0, "{v}");
    let rows = v["devices"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "2 namespaces x 3 queue pairs");
    let ios: u64 = rows.iter().map(|r| r["ios"].as_u64().unwrap()).sum();
    assert_eq!(ios, 6000);
}

#[test]
fn file_backend() {
    let dir = std::env::temp_dir().join(format!("pollux-perf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("disk.img");
    let trid = format!("trtype:soft backend:file path:{} size:2MiB", f.display());
    let (code, v) = perf_json(&[
        "--inline",
        "-t",
        "0",
        "--io-count",
        "2000",
        "-q",
        "8",
        "-w",
        "randrw",
        "--verify",
        "-r",
        &trid,
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 2 << 20);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["perf", "-r", "trtype:soft lbads:1000"], "lbads"),
        (&["perf", "-r", "trtype:nvme"], "unknown trtype"),
        (&["perf", "-o", "1000"], "multiple of 512"),
        (&["perf", "-q", "0"], "-q"),
        (&["perf", "--inline", "-c", "0,1"], "exactly one worker"),
        (&["perf", "-r", "trtype:soft backend:file"], "path:"),
        (
            &["perf", "-o", "8192", "-r", "trtype:soft size:4KiB"],
            "smaller than one I/O",
        ),
        (
            &["perf", "-r", "trtype:pcie traddr:ffff:ff:1f.7", "-t", "1"],
            "no PCI device ffff:ff:1f.7",
        ),
        (
            &["perf", "-r", "trtype:pcie traddr:nonsense", "-t", "1"],
            "not a PCI address",
        ),
    ];
    for (args, want) in cases {
        let (code, _out, err) = pollux(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected '{want}' in: {err}");
    }
}

/// Impossible option values are refused before the run, and the message
/// names the option, its value and the limit.
#[test]
fn impossible_options_are_refused_naming_them() {
    let core = unavailable_core().to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["-o", "0"], vec!["-o 0", "non-zero"]),
        (vec!["-q", "0"], vec!["'0' for '--queue-depth", "1..=65535"]),
        (vec!["-P", "0"], vec!["'0' for '--qpairs", "1..=65535"]),
        (vec!["-t", "0"], vec!["-t 0", "--io-count"]),
        (
            vec!["-t", "0", "--io-count", "0"],
            vec!["--io-count 0", "at least 1"],
        ),
        (vec!["--io-count", "0"], vec!["--io-count 0"]),
        (
            vec!["--timeout-ms", "18446744073709551615"],
            vec!["--timeout-ms 18446744073709551615", "at most 86400000"],
        ),
        (
            vec!["--device-core", &core],
            vec!["--device-core", "is not available", "available: "],
        ),
        (
            vec!["-c", &core],
            vec!["-c", "is not available", "available: "],
        ),
        // It grants 64 I/O queue pairs.
        (
            vec!["-P", "33", "-r", "trtype:soft ns:2"],
            vec!["-P 33", "need 66", "granted 64"],
        ),
        (
            vec!["-o", "1024", "-r", "trtype:soft lbads:4096"],
            vec!["-o 1024", "LBA size 4096"],
        ),
        (
            vec!["-o", "8k", "-r", "trtype:soft size:4KiB"],
            vec!["-o 8192", "namespace (4096 bytes)"],
        ),
        // 64 queue pairs x 4095 x 64 MiB = 16 TiB of buffers: more than any
        // machine has, refused before a byte is allocated.
        (
            vec!["-q", "4095", "-o", "64m", "-P", "64"],
            vec!["-q 4095", "-o 67108864", "64 queue pair(s)", "MemAvailable"],
        ),
    ];
    for (args, wants) in cases {
        let mut a = vec!["perf", "--inline"];
        a.extend_from_slice(&args);
        let (code, out, err) = pollux(&a);
        assert_eq!(code, 2, "{a:?}: {out} {err}");
        for w in wants {
            assert!(err.contains(w), "{a:?}: expected '{w}' in: {err}");
        }
        assert!(out.is_empty(), "{a:?}: no run: {out}");
    }
}

#[test]
fn table_output_and_status_lines() {
    let (code, out, _err) = pollux(&[
        "perf",
        "--inline",
        "-t",
        "0",
        "--io-count",
        "1000",
        "-q",
        "4",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("Device Information"), "{out}");
    assert!(out.contains("Total"), "{out}");
    assert!(out.contains("Doorbell writes per I/O"), "{out}");
}

#[test]
fn threaded_device_two_workers() {
    // The realistic mode: device thread plus two workers (run briefly).
    let (code, v) = perf_json(&[
        "-t",
        "0",
        "--io-count",
        "20000",
        "-q",
        "16",
        "-c",
        "0-1",
        "-P",
        "2",
    ]);
    assert_eq!(code, 0);
    assert_eq!(v["total"]["ios"], 20000);
    assert_eq!(v["cores"].as_array().unwrap().len(), 2);
    // Each core has -P 2 queue pairs on the namespace.
    let rows = v["devices"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{v}");
    for core in [0, 1] {
        let on = rows
            .iter()
            .filter(|r| {
                r["name"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("from core {core}"))
            })
            .count();
        assert_eq!(on, 2, "core {core}: {v}");
    }
}

/// pingpong refuses counts whose round-trip counter would overflow (it used
/// to wrap and spin forever) or whose results cannot be held, and cores it
/// cannot run on.
#[test]
fn pingpong_refuses_impossible_counts() {
    let core = unavailable_core().to_string();
    let both = format!("0,{core}");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--trips", "9223372036854775807", "--batches", "2"],
            vec!["--trips 9223372036854775807", "--batches 2", "overflow"],
        ),
        (
            vec!["--trips", "1", "--batches", "18446744073709551615"],
            vec!["--batches 18446744073709551615", "at most"],
        ),
        (vec!["--trips", "0"], vec!["--trips 0", "at least 1"]),
        (vec!["--batches", "0"], vec!["--batches 0", "at least 1"]),
        (vec!["-c", "0"], vec!["-c 0", "two cores"]),
        (
            vec!["-c", &both],
            vec!["-c", "is not available", "available: "],
        ),
    ];
    for (args, wants) in cases {
        let mut a = vec!["pingpong"];
        a.extend_from_slice(&args);
        let (code, out, err) = pollux(&a);
        assert_eq!(code, 2, "{a:?}: {out} {err}");
        for w in wants {
            assert!(err.contains(w), "{a:?}: expected '{w}' in: {err}");
        }
    }
}

/// One round trip in one batch (the smallest run) reports a finite,
/// non-negative figure.
#[test]
fn pingpong_tiny_run_reports_sane_numbers() {
    let first_unavailable = unavailable_core();
    if first_unavailable < 2 {
        eprintln!("skipped: pingpong needs CPUs 0 and 1");
        return;
    }
    let (code, out, err) = pollux(&[
        "pingpong",
        "-c",
        "0,1",
        "--trips",
        "1",
        "--batches",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let rt = v["round_trip_ns"].as_f64().unwrap();
    assert!(rt.is_finite() && rt >= 0.0, "{v}");
    assert_eq!(v["batches"].as_array().unwrap().len(), 1);
}

/// The numbers of the row of the -L percentile table named `name` (the
/// row with eight numbers: average, min, p50, p90, p99, p99.9, p99.99,
/// max).
fn percentile_row(out: &str, name: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim_end() == name)
        .map(|(_, rest)| {
            rest.split_whitespace()
                .map(|x| x.parse::<f64>())
                .collect::<Result<Vec<_>, _>>()
        })
        .find_map(|r| r.ok().filter(|v| v.len() == 8))
        .unwrap_or_else(|| panic!("no percentile row '{name}' in:\n{out}"))
}

/// min <= p50 <= .. <= p99.99 <= max, and the average between min and max.
fn assert_monotone(v: &[f64], what: &str) {
    let (avg, rest) = (v[0], &v[1..]);
    assert!(
        rest[0] > 0.0 && rest.windows(2).all(|w| w[0] <= w[1]),
        "{what}: {v:?}"
    );
    assert!(rest[0] <= avg && avg <= rest[6], "{what}: {v:?}");
}

/// -L: the percentile table (p50 .. p99.99) after SPDK's table, its values
/// in order, for the queue pair and the total.
#[test]
fn dash_l_prints_percentile_rows_in_order() {
    let (code, out, err) = pollux(&[
        "perf",
        "--inline",
        "-t",
        "0",
        "--io-count",
        "5000",
        "-q",
        "4",
        "-L",
    ]);
    assert_eq!(code, 0, "{err}");
    for col in [
        "Average", "min", "p50", "p90", "p99", "p99.9", "p99.99", "max",
    ] {
        assert!(out.contains(col), "{col} missing:\n{out}");
    }
    assert_monotone(&percentile_row(&out, "Total"), "Total");
    assert_monotone(
        &percentile_row(&out, "soft0 (null) NSID 1 qpair 0 from core 0"),
        "the queue pair",
    );
    assert!(!out.contains("not measured"), "{out}");
    assert!(!out.contains("Latency histogram"), "only with -LL: {out}");
}

/// -L with a mixed workload: reads and writes in rows of their own.
#[test]
fn dash_l_randrw_has_read_and_write_rows() {
    let (code, out, err) = pollux(&[
        "perf",
        "--inline",
        "-t",
        "0",
        "--io-count",
        "5000",
        "-q",
        "4",
        "-L",
        "-w",
        "randrw",
    ]);
    assert_eq!(code, 0, "{err}");
    for row in ["Total reads", "Total writes", "Total"] {
        assert_monotone(&percentile_row(&out, row), row);
    }
    let qp = "soft0 (null) NSID 1 qpair 0 from core 0";
    assert_monotone(&percentile_row(&out, &format!("{qp} reads")), "reads");
    assert_monotone(&percentile_row(&out, &format!("{qp} writes")), "writes");
}

/// -LL: SPDK's histogram layout, one per queue pair, its buckets holding
/// every I/O of the run.
#[test]
fn dash_ll_prints_a_histogram() {
    let (code, out, err) = pollux(&[
        "perf",
        "--inline",
        "-t",
        "0",
        "--io-count",
        "5000",
        "-q",
        "4",
        "-LL",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Latency histogram for soft0 (null) NSID 1 qpair 0 from core 0:"),
        "{out}"
    );
    assert!(
        out.contains("Range in us     Cumulative    IO count"),
        "{out}"
    );
    // "   2.435 -     2.656:   71.3500%  (    13342)"
    let counts: Vec<u64> = out
        .lines()
        .filter(|l| l.contains(" - ") && l.ends_with(')'))
        .map(|l| {
            let c = l.rsplit_once('(').unwrap().1.trim_end_matches(')');
            c.trim().parse().unwrap()
        })
        .collect();
    assert!(!counts.is_empty(), "{out}");
    assert_eq!(counts.iter().sum::<u64>(), 5000, "{out}");
    assert!(out.contains("100.0000%"), "{out}");
}

/// --json with -L: the percentiles, reads and writes apart for randrw;
/// with -LL the histogram; and the samples taken each second.
#[test]
fn json_has_percentiles_histogram_and_samples() {
    let ordered = common::latencies_in_order;
    let (code, v) = perf_json(&[
        "--inline",
        "-t",
        "0",
        "--io-count",
        "4000",
        "-q",
        "4",
        "-L",
        "-w",
        "randrw",
    ]);
    assert_eq!(code, 0, "{v}");
    let t = &v["total"];
    assert!(ordered(t), "{t}");
    assert!(ordered(&t["read"]) && ordered(&t["write"]), "{t}");
    assert!(ordered(&v["devices"][0]["read"]), "{v}");
    assert!(t["histogram"].is_null(), "{t}");

    let (code, v) = perf_json(&["--inline", "-t", "2", "-q", "4", "-LL"]);
    assert_eq!(code, 0, "{v}");
    let t = &v["total"];
    assert!(ordered(t), "{t}");
    let n: u64 = t["histogram"]
        .as_array()
        .expect("total.histogram")
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(n), t["ios"].as_u64(), "{t}");
    let samples = v["samples"].as_array().expect("samples");
    assert!(!samples.is_empty(), "{v}");
    for s in samples {
        let (iops, mib) = (s["iops"].as_f64().unwrap(), s["mib_s"].as_f64().unwrap());
        assert!(iops > 0.0 && s["t_s"].as_f64().unwrap() > 0.5, "{s}");
        assert!((mib - iops * 4096.0 / 1048576.0).abs() < 1e-6 * iops, "{s}");
    }
}

/// Without -L no clock is read per I/O, and the table says so in one line
/// where the latency columns would be (no columns of dashes).
#[test]
fn without_dash_l_one_line_says_latency_is_not_measured() {
    let (code, out, err) = pollux(&[
        "perf",
        "--inline",
        "-t",
        "0",
        "--io-count",
        "1000",
        "-q",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    let line = "latency: not measured (no clock read per I/O); -L to measure";
    assert_eq!(out.matches(line).count(), 1, "{out}");
    assert!(!out.contains("Average") && !out.contains("p99"), "{out}");
    let (_, v) = perf_json(&["--inline", "-t", "0", "--io-count", "1000", "-q", "4"]);
    assert!(v["total"]["p50_lat_us"].is_null(), "{v}");
}
