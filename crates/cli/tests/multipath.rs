//! `pollux perf --multipath` over two `pollux target` processes exporting
//! one file (io_uring) under one subsystem NQN: one target is killed and
//! restarted during `--verify`, with no error and the path back; both
//! selectors use both paths; a path to another subsystem is refused by
//! name.
mod common;

use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.pollux:mp-test";

fn perf_json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn verify_over_two_paths_while_one_target_is_killed_and_restarted() {
    let file = common::image("mp-kill");
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, NQN, 0);
    let (ra, rb) = (a.trid(NQN), b.trid(NQN));
    let args = [
        "perf",
        "--multipath",
        "-r",
        &ra,
        "-r",
        &rb,
        "-q",
        "16",
        "-o",
        "4096",
        "-w",
        "randrw",
        "-t",
        "7",
        "--verify",
        "-c",
        "0",
        "--json",
    ];
    let child = common::spawn(&args);
    // Kill the first target 1.5 s in, serve the file again on its port
    // 1.5 s later: its path comes back for the rest of the run.
    let killer = a.kill_and_restart(&file, NQN, Duration::from_millis(1500));
    let (code, out, err) = common::finish(child, &args, None);
    let _again = killer.join().unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    let j = perf_json(&out);
    assert_eq!(j["total"]["errors"], 0, "{out}\n{err}");
    assert!(j["total"]["ios"].as_u64().unwrap() > 1000, "{out}");
    let paths = j["devices"][0]["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    assert_eq!(paths[0]["downs"], 1, "{paths:?}");
    assert_eq!(
        paths[0]["ups"], 1,
        "the path did not come back: {paths:?}\n{err}"
    );
    assert_eq!(paths[1]["downs"], 0, "{paths:?}");
    let gap = j["total"]["max_completion_gap_us"].as_f64().unwrap();
    assert!(gap > 0.0, "{out}");
    drop(b);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn both_selectors_use_both_paths() {
    let file = common::image("mp-sel");
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, NQN, 0);
    let (ra, rb) = (a.trid(NQN), b.trid(NQN));
    for sel in ["round_robin", "queue_depth"] {
        let args = [
            "perf",
            "--multipath",
            "--multipath-selector",
            sel,
            "-r",
            &ra,
            "-r",
            &rb,
            "-q",
            "8",
            "-o",
            "4096",
            "-w",
            "randread",
            "-t",
            "1",
            "-c",
            "0",
            "--json",
        ];
        let (code, out, err) = common::pollux(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        let j = perf_json(&out);
        assert_eq!(j["config"]["multipath"]["selector"], sel);
        for p in j["devices"][0]["paths"].as_array().unwrap() {
            assert!(p["submitted"].as_u64().unwrap() > 100, "{sel}: {p}");
        }
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_path_to_another_subsystem_is_refused_by_name() {
    let file = common::image("mp-other");
    let other = "nqn.2024-01.io.pollux:mp-other";
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, other, 0);
    let (ra, rb) = (a.trid(NQN), b.trid(other));
    let args = [
        "perf",
        "--multipath",
        "-r",
        &ra,
        "-r",
        &rb,
        "-t",
        "1",
        "-c",
        "0",
    ];
    let (code, out, err) = common::pollux(&args);
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{}", b.port)) && err.contains("subsystem NQN"),
        "{err}"
    );
    let _ = std::fs::remove_file(&file);
}
