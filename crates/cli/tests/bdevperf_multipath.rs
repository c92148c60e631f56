//! `pollux bdevperf` over a multipath NVMe bdev: two `pollux target`
//! processes export one file (io_uring) under one subsystem NQN; one is
//! killed and restarted during `--verify`, with no error. The paths are
//! given as `--multipath --nvme A --nvme B`.
mod common;

use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.pollux:bdev-mp-test";

fn json(out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\n{err}"))
}

#[test]
fn bdevperf_verify_over_two_paths_while_one_target_is_killed_and_restarted() {
    let file = common::image("bdev-mp-kill");
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, NQN, 0);
    let port = a.port;
    let (ra, rb) = (a.trid(NQN), b.trid(NQN));
    let args = [
        "bdevperf",
        "--json",
        "--multipath",
        "--nvme",
        &ra,
        "--nvme",
        &rb,
        "-q",
        "16",
        "-o",
        "4096",
        "-w",
        "randrw",
        "-t",
        "6",
        "--verify",
        "-m",
        "0",
    ];
    let child = common::spawn(&args);
    // Kill the first target 1.5 s in, serve the file again on its port
    // 1.5 s later.
    let file2 = file.clone();
    let killer = std::thread::spawn(move || {
        let mut a = a;
        std::thread::sleep(Duration::from_millis(1500));
        let _ = a.child.kill();
        let _ = a.child.wait();
        std::thread::sleep(Duration::from_millis(1500));
        common::FileTarget::start(&file2, NQN, port)
    });
    let (code, out, err) = common::finish(child, &args, None);
    let _again = killer.join().unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    let v = json(&out, &err);
    assert_eq!(v["jobs"][0]["name"], "Nvme0n1", "{v}");
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["total"]["errors"], 0, "{v}\n{err}");
    assert!(v["total"]["ios"].as_u64().unwrap() > 1000, "{v}");
    assert!(err.contains("multipath: path down"), "{err}");
    drop(b);
    let _ = std::fs::remove_file(&file);
}

/// An SPDK JSON configuration attaching `Nvme0` once per port, the
/// later ones with `"multipath": "multipath"`.
fn config(tag: &str, ports: &[u16]) -> std::path::PathBuf {
    let entries: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mp = if i == 0 {
                ""
            } else {
                r#", "multipath": "multipath""#
            };
            format!(
                r#"{{"method": "bdev_nvme_attach_controller",
                    "params": {{"name": "Nvme0", "trtype": "tcp", "adrfam": "ipv4",
                               "traddr": "127.0.0.1", "trsvcid": "{p}", "subnqn": "{NQN}"{mp}}}}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"subsystems": [{{"subsystem": "bdev", "config": [{}]}}]}}"#,
        entries.join(", ")
    );
    let p = std::env::temp_dir().join(format!("pollux-bdev-mp-{}-{tag}.json", std::process::id()));
    std::fs::write(&p, json).unwrap();
    p
}

#[test]
fn json_attach_of_one_name_twice_with_multipath_is_one_bdev_over_two_paths() {
    let file = common::image("bdev-mp-json");
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, NQN, 0);
    let cfg = config("json", &[a.port, b.port]);
    let path = cfg.display().to_string();
    let args = [
        "bdevperf", "--json", "-c", &path, "-q", "8", "-o", "4096", "-w", "randrw", "-t", "1",
        "--verify", "-m", "0",
    ];
    let (code, out, err) = common::pollux(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    let v = json(&out, &err);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["jobs"][0]["name"], "Nvme0n1", "{v}");
    assert_eq!(v["total"]["errors"], 0, "{v}");
    assert!(v["total"]["ios"].as_u64().unwrap() > 100, "{v}");
    // The mode is understood, not ignored with a warning.
    assert!(!err.contains("multipath"), "{err}");

    // A path to another namespace (another file, of another size) is
    // refused, named.
    let other = common::image("bdev-mp-json-other");
    std::fs::File::options()
        .write(true)
        .open(&other)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let c = common::FileTarget::start(&other, NQN, 0);
    let cfg2 = config("json-other", &[a.port, c.port]);
    let path2 = cfg2.display().to_string();
    let args = ["bdevperf", "-c", &path2, "-t", "1", "-m", "0"];
    let (code, out, err) = common::pollux(&args);
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("Nvme0") && err.contains(&format!("127.0.0.1:{}", c.port)),
        "{err}"
    );
    drop((a, b, c));
    for f in [file, other] {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_file(cfg);
    let _ = std::fs::remove_file(cfg2);
}
