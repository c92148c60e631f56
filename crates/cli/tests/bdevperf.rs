//! `pollux bdevperf` end to end: the binary as a user runs it. `--io-count`
//! keeps runs short and their counts exact; `--inline` makes emulated NVMe
//! controllers deterministic.

use std::time::Duration;

use serde_json::Value;

mod common;
use common::{finish, pollux, spawn};

fn bdevperf_json(args: &[&str]) -> (i32, Value, String) {
    let mut a = vec!["bdevperf", "--json"];
    a.extend_from_slice(args);
    let (code, out, err) = pollux(&a);
    let v: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\nstderr: {err}"));
    (code, v, err)
}

/// The CPUs this process may run on.
fn online_cpus() -> Vec<usize> {
    common::allowed_cores()
}

fn first_core() -> String {
    online_cpus()[0].to_string()
}

fn job_names(v: &Value) -> Vec<String> {
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_string())
        .collect()
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pollux-bdevperf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn null_and_ram_counts_are_exact_and_the_fields_are_there() {
    let core = first_core();
    let (code, v, _) = bdevperf_json(&[
        "--null",
        "--ram",
        "8MiB",
        "-m",
        &core,
        "-t",
        "0",
        "--io-count",
        "10001",
        "-q",
        "16",
    ]);
    assert_eq!(code, 0, "{v}");
    let t = &v["total"];
    assert_eq!(t["ios"], 10001);
    assert_eq!(t["errors"], 0);
    assert!(t["iops"].as_f64().unwrap() > 0.0, "{t}");
    assert!(t["mib_s"].as_f64().unwrap() > 0.0, "{t}");
    // Without -L no latency is measured.
    assert!(t["avg_lat_us"].is_null());
    assert_eq!(job_names(&v), ["Null0", "Malloc0"]);
    let ios: Vec<u64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["ios"].as_u64().unwrap())
        .collect();
    assert_eq!(ios, [5001, 5000], "split evenly, the remainder first");
    for j in v["jobs"].as_array().unwrap() {
        // Each poll completes at most a queue's worth (-q 16).
        let polls = j["polls"].as_u64().unwrap();
        assert!(polls * 16 >= j["ios"].as_u64().unwrap(), "{j}");
    }
    // The bdevs' own counters agree with the jobs'.
    let b = v["bdevs"].as_array().unwrap();
    assert_eq!(b[0]["backend"], "null");
    assert_eq!(b[1]["backend"], "ram");
    assert_eq!(b[1]["num_blocks"], 16384);
    assert_eq!(b[0]["reads"], 5001);
    assert_eq!(b[1]["reads"], 5000);
    assert_eq!(v["interrupted"], false);
}

#[test]
fn timed_run_prints_status_lines_and_the_spdk_table() {
    let (code, out, err) = pollux(&[
        "bdevperf",
        "--null",
        "-t",
        "2",
        "-q",
        "8",
        "-m",
        &first_core(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("[   1s]") && err.contains("IOPS"), "{err}");
    for want in [
        "Device Information",
        "runtime(s)",
        "Fail/s",
        "TO/s",
        "Job: Null0 (Core Mask 0x",
        "workload: randread, depth: 8, IO size: 4096",
        "Total",
        "errors: 0",
    ] {
        assert!(out.contains(want), "'{want}' missing:\n{out}");
    }
}

#[test]
fn latency_fields_with_dash_l() {
    let (code, v, _) = bdevperf_json(&["--null", "-L", "-t", "0", "--io-count", "5000", "-q", "4"]);
    assert_eq!(code, 0);
    let t = &v["total"];
    assert!(t["avg_lat_us"].as_f64().is_some(), "{t}");
    assert!(common::latencies_in_order(t), "{t}");
    assert!(v["jobs"][0]["avg_lat_us"].as_f64().is_some());
    assert!(t["histogram"].is_null(), "a histogram only with -LL: {t}");
}

/// -LL (the count of -L, shared with perf): the percentile table and a
/// histogram whose buckets hold every I/O.
#[test]
fn dash_ll_prints_percentiles_and_a_histogram() {
    let args = [
        "bdevperf",
        "--null",
        "-LL",
        "-t",
        "0",
        "--io-count",
        "3000",
        "-q",
        "4",
    ];
    let (code, out, err) = pollux(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("p99.99") && out.contains("Range in us"),
        "{out}"
    );
    let (code, v, _) = bdevperf_json(&args[1..]);
    assert_eq!(code, 0);
    let h = v["total"]["histogram"].as_array().expect("total.histogram");
    let n: u64 = h.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(n, 3000, "{h:?}");
}

#[test]
fn verify_passes_on_ram_for_every_pattern() {
    for w in ["randwrite", "write", "randrw", "rw", "verify"] {
        let (code, v, _) = bdevperf_json(&[
            "--ram",
            "1MiB",
            "-w",
            w,
            "--verify",
            "-t",
            "0",
            "--io-count",
            "20000",
            "-q",
            "16",
        ]);
        assert_eq!(code, 0, "-w {w}: {v}");
        assert_eq!(v["total"]["ios"], 20000, "-w {w}");
        assert_eq!(v["total"]["errors"], 0, "-w {w}: {}", v["errors"]);
    }
    // -w verify alone (no --verify) reads back every write: half the I/Os.
    let (code, v, _) = bdevperf_json(&[
        "--ram",
        "1MiB",
        "-w",
        "verify",
        "-t",
        "0",
        "--io-count",
        "2000",
        "-q",
        "8",
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["bdevs"][0]["reads"], 1000);
    assert_eq!(v["bdevs"][0]["writes"], 1000);
}

#[test]
fn verify_passes_on_an_emulated_ram_controller() {
    let trid = "trtype:soft backend:ram size:4MiB";
    let core = first_core();
    // Inline (deterministic) and with the controller on its device thread.
    for extra in [&["--inline"][..], &[][..]] {
        let mut args = vec![
            "--nvme",
            trid,
            "-w",
            "randrw",
            "--verify",
            "-t",
            "0",
            "--io-count",
            "20000",
            "-q",
            "32",
            "-m",
            &core,
        ];
        args.extend_from_slice(extra);
        let (code, v, err) = bdevperf_json(&args);
        assert_eq!(code, 0, "{extra:?}: {v}\n{err}");
        assert_eq!(v["total"]["ios"], 20000);
        assert_eq!(v["total"]["errors"], 0, "{}", v["errors"]);
        assert_eq!(job_names(&v), ["Nvme0n1"]);
        assert_eq!(v["bdevs"][0]["backend"], "nvme");
        // The controller shuts down while its device still runs: no
        // timed-out shutdown, no unmapped queue memory (the registry's
        // bdevs once outlived the device thread, 20 s and an IOMMU fault
        // at every exit).
        assert!(
            !err.contains("did not complete")
                && !err.contains("timed out")
                && !err.contains("IOMMU fault"),
            "{extra:?}: the controller's shutdown failed:\n{err}"
        );
    }
}

/// Foreign data on the device: every read fails verification, the run
/// exits 1 and the first error names the LBA.
#[test]
fn verify_fails_on_foreign_data_and_names_the_lba() {
    let dir = temp_dir("foreign");
    let f = dir.join("disk.img");
    std::fs::write(&f, vec![0xA5u8; 64 << 10]).unwrap();
    let trid = format!("trtype:soft backend:file path:{} size:64KiB", f.display());
    let (code, v, _) = bdevperf_json(&[
        "--nvme",
        &trid,
        "--inline",
        "-m",
        &first_core(),
        "-w",
        "randread",
        "--verify",
        "-t",
        "0",
        "--io-count",
        "100",
        "-q",
        "8",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1, "errors must give exit status 1: {v}");
    assert_eq!(v["total"]["errors"], 100, "every read fails: {v}");
    let first = v["errors"][0].as_str().unwrap();
    assert!(
        first.starts_with("Nvme0n1 on core ")
            && first.contains("verify: LBA ")
            && first.contains("tag mismatch"),
        "{first}"
    );
}

/// A bdev that fails mid-run: the failed I/Os are counted and reported,
/// the run still ends (no hang on refused submissions) and exits 1.
#[test]
fn failed_io_gives_exit_status_1() {
    let (code, v, _) = bdevperf_json(&[
        "--ram",
        "1MiB",
        "--inject-failure-after",
        "1000",
        "-t",
        "0",
        "--io-count",
        "100000",
        "-q",
        "8",
    ]);
    assert_eq!(code, 1, "{v}");
    let t = &v["total"];
    assert!(t["errors"].as_u64().unwrap() > 0, "{t}");
    assert!(t["ios"].as_u64().unwrap() < 100000, "it gave up: {t}");
    let errs = v["errors"].as_array().unwrap();
    assert!(
        errs.iter()
            .any(|e| e.as_str().unwrap().contains("backend has failed")),
        "{errs:?}"
    );
    assert!(t["fail_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn config_file_bdevs_all_get_jobs() {
    let dir = temp_dir("config");
    let cfg = dir.join("bdev.json");
    std::fs::write(
        &cfg,
        r#"{"subsystems": [
             {"subsystem": "accel", "config": []},
             {"subsystem": "bdev", "config": [
               {"method": "bdev_set_options", "params": {"bdev_io_pool_size": 65535}},
               {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 262144, "block_size": 4096}},
               {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 8192, "block_size": 512}},
               {"method": "bdev_nvme_attach_controller",
                "params": {"name": "Nvme0", "trtype": "soft", "backend": "ram", "size": "2MiB", "ns": 2}},
               {"method": "bdev_wait_for_examine"}
             ]}]}"#,
    )
    .unwrap();
    let path = cfg.display().to_string();
    let (code, v, err) = bdevperf_json(&[
        "-c",
        &path,
        "--ram",
        "1MiB",
        "-t",
        "0",
        "--io-count",
        "4000",
        "-q",
        "8",
        "-w",
        "randrw",
    ]);
    assert_eq!(code, 0, "{v}\n{err}");
    // Config bdevs first, in order, then the quick ones (named apart).
    assert_eq!(
        job_names(&v),
        ["Null0", "Malloc0", "Nvme0n1", "Nvme0n2", "Malloc1"]
    );
    assert_eq!(v["total"]["ios"], 4000);
    assert_eq!(v["total"]["errors"], 0);
    for j in v["jobs"].as_array().unwrap() {
        assert_eq!(j["ios"], 800, "{j}");
    }
    // SPDK's tuning method is ignored with a warning naming it.
    assert!(
        err.contains("bdev_set_options") && err.contains("ignored"),
        "{err}"
    );
    // -T picks one of them.
    let (code, v, _) = bdevperf_json(&[
        "-c",
        &path,
        "-T",
        "Malloc0",
        "-t",
        "0",
        "--io-count",
        "100",
        "-q",
        "8",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 0);
    assert_eq!(job_names(&v), ["Malloc0"]);
}

/// With -C every core of the mask gets a job on every bdev.
#[test]
fn every_core_gets_a_job_on_every_bdev() {
    let cpus = online_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let mask = format!("[{},{}]", cpus[0], cpus[1]);
    let (code, v, _) = bdevperf_json(&[
        "--null",
        "--ram",
        "1MiB",
        "-C",
        "-m",
        &mask,
        "-w",
        "randwrite",
        "-t",
        "0",
        "--io-count",
        "8000",
        "-q",
        "8",
    ]);
    assert_eq!(code, 0, "{v}");
    let jobs: Vec<(String, u64)> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["name"].as_str().unwrap().into(),
                j["core"].as_u64().unwrap(),
            )
        })
        .collect();
    let (a, b) = (cpus[0] as u64, cpus[1] as u64);
    assert_eq!(
        jobs,
        [
            ("Null0".into(), a),
            ("Null0".into(), b),
            ("Malloc0".into(), a),
            ("Malloc0".into(), b)
        ]
    );
    assert_eq!(v["total"]["ios"], 8000);
    // Without -C: one job per bdev, round-robin over the cores.
    let (_, v, _) = bdevperf_json(&[
        "--null",
        "--ram",
        "1MiB",
        "-m",
        &mask,
        "-t",
        "0",
        "--io-count",
        "100",
    ]);
    let cores: Vec<u64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["core"].as_u64().unwrap())
        .collect();
    assert_eq!(cores, [a, b]);
}

/// SIGINT stops a long run early: it still drains, prints the summary
/// and exits normally.
#[test]
fn sigint_stops_the_run_and_prints_the_summary() {
    let args = [
        "bdevperf", "--json", "--ram", "4MiB", "-w", "randrw", "--verify", "-t", "60",
    ];
    let child = spawn(&args);
    let kill = |pid: u32| {
        // SAFETY: kill(2) on the child we spawned.
        unsafe {
            libc::kill(pid as i32, libc::SIGINT);
        }
    };
    let (code, out, err) = finish(child, &args, Some((Duration::from_millis(1500), &kill)));
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["interrupted"], true);
    assert!(v["total"]["ios"].as_u64().unwrap() > 0);
    assert_eq!(v["total"]["errors"], 0, "{}", v["errors"]);
    assert!(
        v["total"]["seconds"].as_f64().unwrap() < 60.0,
        "stopped before -t: {}",
        v["total"]
    );
}

/// An io_uring bdev on a file, with --verify, from the quick flag and
/// from -c (bdev_uring_create), and with the poller yielding after every
/// empty poll.
#[test]
fn uring_file_verifies() {
    let dir = temp_dir("uring");
    // A file each: a run's tags are foreign data to the other.
    let (f1, f2, f3) = (dir.join("a.img"), dir.join("b.img"), dir.join("c.img"));
    for f in [&f1, &f2, &f3] {
        std::fs::write(f, vec![0u8; 4 << 20]).unwrap();
    }
    let (p1, p2) = (f1.display().to_string(), f2.display().to_string());
    let p3 = f3.display().to_string();
    let cfg = dir.join("bdev.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"subsystems": [{{"subsystem": "bdev", "config": [
                 {{"method": "bdev_uring_create", "params": {{"name": "Uring7", "filename": "{p2}", "block_size": 4096}}}}]}}]}}"#
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    for (args, name) in [
        (vec!["--uring", &p1], "Uring0"),
        (vec!["-c", &cfg], "Uring7"),
        (vec!["--uring", &p3, "--uring-yield", "1"], "Uring0"),
    ] {
        let mut a = args.clone();
        a.extend_from_slice(&[
            "-w",
            "randrw",
            "--verify",
            "-t",
            "0",
            "--io-count",
            "5000",
            "-q",
            "16",
        ]);
        let (code, v, err) = bdevperf_json(&a);
        assert_eq!(code, 0, "{args:?}: {v}\n{err}");
        assert_eq!(job_names(&v), [name]);
        assert_eq!(v["bdevs"][0]["backend"], "uring");
        assert_eq!(v["total"]["ios"], 5000);
        assert_eq!(v["total"]["errors"], 0, "{}", v["errors"]);
    }
    // What the first run wrote is in the file: a later run reads it back
    // with the tags of its LBAs (unwritten units read zeros).
    let (code, v, _) = bdevperf_json(&[
        "--uring",
        &p1,
        "-w",
        "randread",
        "--verify",
        "-o",
        "512",
        "-t",
        "0",
        "--io-count",
        "2000",
        "-q",
        "8",
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["total"]["errors"], 0, "{}", v["errors"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_are_refused_naming_them() {
    let dir = temp_dir("bad");
    let unknown = dir.join("unknown.json");
    std::fs::write(
        &unknown,
        r#"{"subsystems": [{"subsystem": "bdev", "config": [
             {"method": "bdev_aio_create", "params": {"name": "a", "filename": "/dev/null"}}]}]}"#,
    )
    .unwrap();
    let missing = dir.join("missing.json");
    let file = dir.join("disk.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let (u, m) = (unknown.display().to_string(), missing.display().to_string());
    let f = file.display().to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--null", "-q", "0"],
            vec!["'0' for '--queue-depth", "1..=65535"],
        ),
        (
            vec!["--null", "-o", "1000"],
            vec!["-o 1000", "multiple of 512"],
        ),
        (
            vec!["--ram", "1MiB", "--block-size", "4096", "-o", "1024"],
            vec!["-o 1024", "Malloc0", "block size 4096"],
        ),
        (
            vec!["-c", &u],
            vec!["-c", "bdev_aio_create", "not supported"],
        ),
        (vec!["-c", &m], vec!["-c", "missing.json"]),
        (vec!["--null", "-m", "0x0"], vec!["-m 0x0"]),
        (vec!["--null", "-m", "[0,1"], vec!["-m [0,1", "brackets"]),
        (vec!["--null", "-T", "Nope"], vec!["-T Nope", "Null0"]),
        (vec![], vec!["no bdevs", "--null"]),
        (
            vec!["--null", "--verify"],
            vec!["--verify", "Null0", "keeps no data"],
        ),
        (vec!["--null", "-w", "verify"], vec!["-w verify", "Null0"]),
        (vec!["--null", "-t", "0"], vec!["-t 0", "--io-count"]),
        (vec!["--null", "--inline"], vec!["--inline", "--nvme"]),
        (
            vec!["--ram", "1000"],
            vec!["--ram 1000", "--block-size 512"],
        ),
        (
            vec!["--nvme", "trtype:soft colour:blue"],
            vec!["--nvme", "colour"],
        ),
        (
            vec!["--null", "--block-size", "1000"],
            vec!["--block-size 1000"],
        ),
        (vec!["--null", "--iopoll"], vec!["--iopoll", "--uring PATH"]),
        (
            vec!["--uring", &f, "--iopoll"],
            vec!["--uring", "disk.img", "regular file"],
        ),
        (
            vec!["--uring", "/nonexistent/disk.img"],
            vec!["--uring /nonexistent/disk.img", "Uring0", "No such file"],
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["bdevperf"];
        a.extend_from_slice(&args);
        let (code, out, err) = pollux(&a);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        for w in want {
            assert!(err.contains(w), "{args:?}: '{w}' missing from: {err}");
        }
        assert!(out.is_empty(), "{args:?}: no run: {out}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The character offsets at which the words of a table line end.
fn word_ends(line: &str) -> Vec<usize> {
    let c: Vec<char> = line.chars().collect();
    (0..c.len())
        .filter(|&i| c[i] != ' ' && c.get(i + 1).is_none_or(|&n| n == ' '))
        .collect()
}

/// A long bdev name (from -c) widens the name column: the header, each
/// job's figures and the total keep their columns at the same offsets.
#[test]
fn the_table_stays_aligned_with_long_bdev_names() {
    let dir = temp_dir("long-names");
    let cfg = dir.join("bdev.json");
    let long = "Malloc_with_a_name_longer_than_the_name_column_of_spdk";
    std::fs::write(
        &cfg,
        format!(
            r#"{{"subsystems": [{{"subsystem": "bdev", "config": [
                {{"method": "bdev_malloc_create", "params": {{"name": "{long}", "num_blocks": 2048, "block_size": 512}}}}
            ]}}]}}"#
        ),
    )
    .unwrap();
    let path = cfg.display().to_string();
    let (code, out, err) = pollux(&[
        "bdevperf",
        "-c",
        &path,
        "--null",
        "-m",
        &first_core(),
        "-t",
        "0",
        "--io-count",
        "2000",
        "-q",
        "4",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        !out.contains('\t'),
        "no tab: the columns do not depend on its width\n{out}"
    );
    let header = out
        .lines()
        .find(|l| l.starts_with("Device Information"))
        .unwrap_or_else(|| panic!("no header:\n{out}"));
    let colon = header.find(':').unwrap();
    // The name, its ':' and eight figures, ending where the header's do.
    let want = word_ends(header)[2..].to_vec();
    assert_eq!(want.len(), 9, "{header}");
    let mut rows = 0;
    for l in out.lines() {
        let figures = l.starts_with("Total")
            || l.trim_start().starts_with(long)
            || l.trim_start().starts_with("Null0");
        if !figures {
            continue;
        }
        rows += 1;
        assert_eq!(l.chars().nth(colon), Some(':'), "the ':' column:\n{out}");
        let ends: Vec<usize> = word_ends(&l[colon..]).iter().map(|e| e + colon).collect();
        // The total has no runtime.
        let mut want = want.clone();
        if l.starts_with("Total") {
            want.remove(1);
        }
        assert_eq!(ends, want, "misaligned:\n{out}");
    }
    assert_eq!(rows, 3, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 23 item 5: seconds at (near) 0 IOPS came from the pinned polling
/// threads waiting for their cores while other processes ran there (a
/// shared 2-vCPU machine: a QEMU guest and compilers), not from pollux.
/// Such seconds now say so: three spinners pinned to the worker's core for
/// part of the run leave it a third of the core or less, and the status
/// lines of those seconds and the summary name the worker and its wait.
/// (`bench/verify_stall_loop.sh` is the loop that found it.)
#[test]
fn seconds_the_worker_is_held_off_its_core_say_so() {
    let core = common::allowed_cores()
        .last()
        .copied()
        .expect("a core")
        .to_string();
    let child = spawn(&["bdevperf", "--null", "-m", &core, "-t", "4"]);
    let hog = |_: u32| {
        let spinners: Vec<_> = (0..3)
            .map(|_| {
                std::process::Command::new("taskset")
                    .args(["-c", &core, "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .expect("taskset (util-linux)")
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1800));
        for mut s in spinners {
            let _ = s.kill();
            let _ = s.wait();
        }
    };
    let args = ["bdevperf", "--null", "-m", &core, "-t", "4"];
    let (code, out, err) = finish(child, &args, Some((Duration::from_millis(1200), &hog)));
    assert_eq!(code, 0, "{err}");
    let worker = format!("note: the worker on core {core} waited ");
    assert!(
        err.lines()
            .any(|l| l.starts_with('[') && l.contains(&worker)),
        "no status line names the worker held off its core:\n{err}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("note: ")
            && (l.contains("held off their cores") || l.contains(&worker[6..]))),
        "the summary does not say so:\n{out}"
    );
}
