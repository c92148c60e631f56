//! `pollux perf`'s run as a whole: SIGINT, worker cores and their queue
//! pairs, the device thread's core, and the summary with controllers of
//! several transports (an NVMe/TCP `pollux target` started here).

use serde_json::Value;

mod common;
use common::pollux;

/// The CPUs this process may run on.
fn available_cores() -> Vec<usize> {
    common::allowed_cores()
}

fn perf_json(args: &[&str]) -> (i32, Value) {
    let mut a = vec!["perf", "--json"];
    a.extend_from_slice(args);
    let (code, out, err) = pollux(&a);
    let v: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\nstderr: {err}"));
    (code, v)
}

/// Waits until `pid` catches SIGINT (its handler is installed: bit 2 of
/// SigCgt in /proc/PID/status), so a signal sent then cannot kill it.
fn wait_for_sigint_handler(pid: u32) {
    let t0 = std::time::Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (libc::SIGINT - 1)) != 0);
        if caught {
            return;
        }
        assert!(
            t0.elapsed() < common::HANG,
            "pollux perf never caught SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SIGINT stops a long run early, as it stops bdevperf's: the workers
/// drain, the summary (table or JSON, marked interrupted) is printed and
/// the exit status is bdevperf's (0 without errors). Before, perf died of
/// the signal without a summary.
#[test]
fn sigint_stops_the_run_and_prints_the_summary() {
    for json in [false, true] {
        let mut args = vec![
            "perf",
            "-r",
            "trtype:soft backend:null size:1GiB",
            "-t",
            "60",
        ];
        if json {
            args.push("--json");
        }
        let child = common::spawn(&args);
        let pid = child.id();
        wait_for_sigint_handler(pid);
        let kill = |pid: u32| {
            // SAFETY: kill(2) on the child we spawned.
            unsafe {
                libc::kill(pid as i32, libc::SIGINT);
            }
        };
        let (code, out, err) = common::finish(
            child,
            &args,
            Some((std::time::Duration::from_millis(500), &kill)),
        );
        assert_eq!(code, 0, "{args:?}: {out}\n{err}");
        if json {
            let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert_eq!(v["interrupted"], true);
            assert!(v["total"]["ios"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(v["total"]["errors"], 0, "{v}");
            assert!(v["total"]["seconds"].as_f64().unwrap() < 60.0, "{v}");
        } else {
            for want in ["Device Information", "Total", "Stopped early by a signal."] {
                assert!(out.contains(want), "'{want}' in: {out}\n{err}");
            }
        }
    }
}

/// With two worker cores and one namespace, each core gets its own queue
/// pair on it and both do I/O (as SPDK's perf). Before, the second core
/// got no queue pair and idled.
#[test]
fn every_worker_core_gets_queue_pairs_on_every_namespace() {
    let cores = available_cores();
    if cores.len() < 2 {
        eprintln!("skipped: needs two cores, this process may use {cores:?}");
        return;
    }
    let mask = format!("{},{}", cores[0], cores[1]);
    let (code, v) = perf_json(&[
        "-r",
        "trtype:soft backend:null size:1GiB",
        "-c",
        &mask,
        "-t",
        "0",
        "--io-count",
        "20000",
        "-q",
        "8",
    ]);
    assert_eq!(code, 0, "{v}");
    let rows = v["devices"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "one queue pair per core: {v}");
    for (r, core) in rows.iter().zip(&cores) {
        let name = r["name"].as_str().unwrap();
        assert!(name.ends_with(&format!("from core {core}")), "{name}");
        assert!(r["ios"].as_u64().unwrap() > 0, "{v}");
    }
    for c in v["cores"].as_array().unwrap() {
        assert!(c["iops"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert_eq!(v["total"]["ios"], 20000);

    // The queue pairs the cores need are counted against what the
    // controller grants (64): 2 cores x -P 40 is too many.
    let (code, out, err) = pollux(&["perf", "-c", &mask, "-P", "40", "-t", "1"]);
    assert_eq!(code, 2, "{out}\n{err}");
    for want in ["-P 40", "x 2 worker core(s)", "need 80", "granted 64"] {
        assert!(err.contains(want), "'{want}' in: {err}");
    }
}

/// The emulated controller's device thread on a worker's core makes the
/// run slow: perf says so and what to do; not when the device has a core
/// of its own, nor with --inline.
#[test]
fn device_thread_on_a_worker_core_is_warned() {
    let cores = available_cores();
    let c = cores[0].to_string();
    let run = |extra: &[&str]| {
        let mut a = vec!["perf", "-t", "0", "--io-count", "2000", "-q", "4", "-c", &c];
        a.extend_from_slice(extra);
        let (code, out, err) = pollux(&a);
        assert_eq!(code, 0, "{a:?}: {out}\n{err}");
        err
    };
    let err = run(&["--device-core", &c]);
    for want in [
        &format!("device thread runs on core {c}, which is also a worker core"),
        "--device-core",
        "--inline",
    ] {
        assert!(err.contains(want), "'{want}' in: {err}");
    }
    assert!(!run(&["--inline"]).contains("device thread"));
    if let Some(other) = cores.get(1) {
        assert!(!run(&["--device-core", &other.to_string()]).contains("device thread"));
    }
}

/// A `pollux target` serving a null namespace under a long NQN (so the
/// TCP controller's name in perf's table is long); killed on drop.
struct Target(std::process::Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const LONG_NQN: &str = "nqn.2016-06.io.pollux:a-subsystem-name-long-enough-to-overflow-the-column";

fn tcp_target() -> (Target, String) {
    let (child, addr, _) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--null",
            "64MiB",
            "--nqn",
            LONG_NQN,
        ],
        std::process::Stdio::null(),
    );
    let port = common::port_of(&addr);
    let trid = format!("trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{LONG_NQN}");
    (Target(child), trid)
}

/// The table's rows (header, devices, total) put their ':' in one column
/// and the bars are as wide as the widest of them.
fn assert_aligned(out: &str) {
    let mut lines: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("Device Information"))
        .filter(|l| !l.starts_with('='))
        .collect();
    let total = lines.iter().position(|l| l.starts_with("Total"));
    lines.truncate(total.unwrap_or_else(|| panic!("no Total row: {out}")) + 1);
    assert!(lines.len() >= 3, "{out}");
    let col = |l: &str| l.find(": ").unwrap_or_else(|| panic!("no ': ' in {l:?}"));
    let want = col(lines[0]);
    for l in &lines {
        assert_eq!(col(l), want, "not aligned:\n{out}");
    }
    let widest = lines.iter().map(|l| l.len()).max().unwrap_or(0);
    let bar = out.lines().find(|l| l.starts_with('=')).unwrap_or("");
    assert!(
        bar.len() >= widest,
        "bar {} < row {widest}:\n{out}",
        bar.len()
    );
}

/// Doorbells are PCIe's: no doorbell figures for a TCP controller (the
/// table's line is gone, the JSON fields are null); with an emulated
/// controller too, the line is there and says whose figures they are. The
/// table stays aligned with the TCP controller's long name.
#[test]
fn doorbell_figures_only_for_pcie_and_the_table_fits_long_names() {
    let (_target, tcp) = tcp_target();
    let core = available_cores()[0].to_string();
    let base = [
        "perf",
        "-t",
        "0",
        "--io-count",
        "2000",
        "-q",
        "8",
        "-c",
        &core,
    ];
    let run = |trids: &[&str], json: bool| {
        let mut a = base.to_vec();
        for t in trids {
            a.extend_from_slice(&["-r", t]);
        }
        if json {
            a.push("--json");
        }
        let (code, out, err) = pollux(&a);
        assert_eq!(code, 0, "{a:?}: {out}\n{err}");
        out
    };
    let soft = "trtype:soft backend:null size:64MiB";

    // TCP only.
    let out = run(&[&tcp], false);
    assert!(out.contains(LONG_NQN), "{out}");
    assert!(!out.contains("Doorbell"), "{out}");
    assert_aligned(&out);
    let v: Value = serde_json::from_str(&run(&[&tcp], true)).unwrap();
    for k in ["sq_doorbells", "cq_doorbells", "shadow_updates"] {
        assert!(v["devices"][0][k].is_null(), "{k}: {v}");
    }
    for k in [
        "sq_doorbells_per_io",
        "cq_doorbells_per_io",
        "shadow_updates_per_io",
    ] {
        assert!(v["total"][k].is_null(), "{k}: {v}");
    }

    // TCP and an emulated controller.
    let out = run(&[&tcp, soft], false);
    assert!(
        out.contains("Doorbell writes per I/O (PCIe and emulated controllers): SQ "),
        "{out}"
    );
    assert_aligned(&out);
    let v: Value = serde_json::from_str(&run(&[&tcp, soft], true)).unwrap();
    let rows = v["devices"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for r in rows {
        let is_tcp = r["name"].as_str().unwrap().starts_with("tcp ");
        assert_eq!(r["sq_doorbells"].is_null(), is_tcp, "{r}");
        assert_eq!(r["shadow_updates"].is_null(), is_tcp, "{r}");
    }
    assert!(v["total"]["sq_doorbells_per_io"].as_f64().is_some(), "{v}");
}
