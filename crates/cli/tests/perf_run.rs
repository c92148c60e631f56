//! `pollux perf`'s run as a whole: SIGINT.

use serde_json::Value;

mod common;

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
