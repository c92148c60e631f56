//! `pollux bdevperf` over a multipath NVMe bdev: two `pollux target`
//! processes export one file (io_uring) under one subsystem NQN; one is
//! killed and restarted during `--verify`, with no error. The paths are
//! given as `--multipath --nvme A --nvme B`.
mod common;

use std::time::Duration;

use serde_json::{json, Value};

const NQN: &str = "nqn.2024-01.io.pollux:bdev-mp-test";

fn json(out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\n{err}"))
}

#[test]
fn bdevperf_verify_over_two_paths_while_one_target_is_killed_and_restarted() {
    let file = common::image("bdev-mp-kill");
    let a = common::FileTarget::start(&file, NQN, 0);
    let b = common::FileTarget::start(&file, NQN, 0);
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
    let killer = a.kill_and_restart(&file, NQN, Duration::from_millis(1500));
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
    live_rpc_attaches_lists_saves_and_detaches_paths(&a, &b, &c);
    drop((a, b, c));
    for f in [file, other] {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_file(cfg);
    let _ = std::fs::remove_file(cfg2);
}

/// `bdev_nvme_attach_controller` of one path of `t` to a target serving
/// JSON-RPC on `sock` (`mode`: its `multipath` parameter), with every
/// parameter SPDK's client `spdk-rpc` sends.
fn attach(sock: &str, t: &common::FileTarget, mode: Option<&str>) -> Value {
    let mut p = json!({"name": "Nvme0", "trtype": "tcp", "adrfam": "ipv4",
        "traddr": "127.0.0.1", "trsvcid": t.port.to_string(), "subnqn": NQN,
        "prchk_reftag": false, "prchk_guard": false, "hdgst": false, "ddgst": false,
        "allow_unrecognized_csi": false, "disable_sq_flow_control": false});
    if let Some(m) = mode {
        p["multipath"] = m.into();
    }
    common::call(sock, "bdev_nvme_attach_controller", p)
}

/// The `trsvcid`s of `Nvme0`'s paths, as `bdev_nvme_get_controllers` lists
/// them.
fn path_ports(sock: &str) -> Vec<String> {
    let r = common::call(sock, "bdev_nvme_get_controllers", json!({"name": "Nvme0"}));
    let c = &r["result"][0];
    assert_eq!(c["name"], "Nvme0", "{r}");
    c["ctrlrs"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|p| {
            assert_eq!(p["state"], "enabled", "{r}");
            assert_eq!(
                (&p["trid"]["trtype"], &p["trid"]["subnqn"]),
                (&json!("TCP"), &json!(NQN)),
                "{r}"
            );
            p["trid"]["trsvcid"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The paths of one namespace through a running target's JSON-RPC, as
/// SPDK's: a second attach of the name with `"multipath": "multipath"`
/// adds a path (without the mode, or to another namespace, refused);
/// `bdev_nvme_get_controllers` lists both; save_config loads into a fresh
/// target with the same two paths; detaching one path by its `trsvcid`
/// leaves the bdev serving I/O on the other.
fn live_rpc_attaches_lists_saves_and_detaches_paths(
    a: &common::FileTarget,
    b: &common::FileTarget,
    c: &common::FileTarget,
) {
    let sock = common::rpc_socket();
    let mut t = common::Target::start(&sock, &[]);
    let r = attach(&sock, a, Some("multipath"));
    assert_eq!(r["result"], json!(["Nvme0n1"]), "{r}");
    // Without the mode the name is in use; "disable" is SPDK's EALREADY.
    assert_eq!(attach(&sock, b, None)["error"]["code"], -17);
    assert_eq!(attach(&sock, b, Some("disable"))["error"]["code"], -114);
    // A path to another namespace: EINVAL naming the path; nothing changed.
    let e = attach(&sock, c, Some("multipath"));
    assert_eq!(e["error"]["code"], -22, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("127.0.0.1:{}", c.port)), "{msg}");
    assert_eq!(path_ports(&sock), [a.port.to_string()]);
    let r = attach(&sock, b, Some("multipath"));
    assert_eq!(r["result"], json!(["Nvme0n1"]), "{r}");
    // The same path twice: EALREADY.
    assert_eq!(attach(&sock, b, Some("multipath"))["error"]["code"], -114);
    let both = [a.port.to_string(), b.port.to_string()];
    assert_eq!(path_ports(&sock), both);
    // The path policy, as SPDK's bdev_nvme_set_multipath_policy.
    let policy = || {
        let b = common::call(&sock, "bdev_get_bdevs", json!({"name": "Nvme0n1"}));
        b["result"][0]["driver_specific"].clone()
    };
    assert_eq!(
        policy(),
        json!({"mp_policy": "active_active", "selector": "round_robin", "rr_min_io": 1})
    );
    let set = |p: Value| common::call(&sock, "bdev_nvme_set_multipath_policy", p);
    let e = set(json!({"name": "Nvme0n1", "policy": "active_passive", "selector": "queue_depth"}));
    assert_eq!(e["error"]["code"], -22, "{e}");
    let r = set(json!({"name": "Nvme0n1", "policy": "active_passive"}));
    assert_eq!(r["result"], true, "{r}");
    assert_eq!(policy(), json!({"mp_policy": "active_passive"}));
    assert_eq!(path_ports(&sock), both);

    // save_config, loaded by a fresh target: the same two paths.
    let saved = common::call(&sock, "save_config", Value::Null)["result"].clone();
    let bdev = saved["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["subsystem"] == "bdev")
        .unwrap_or_else(|| panic!("{saved}"))
        .clone();
    let attaches: Vec<&Value> = bdev["config"].as_array().unwrap().iter().collect();
    assert_eq!(attaches.len(), 2, "{bdev}");
    assert!(
        attaches
            .iter()
            .all(|e| e["params"]["multipath"] == "multipath"),
        "{bdev}"
    );
    let file =
        std::env::temp_dir().join(format!("pollux-bdev-mp-{}-saved.json", std::process::id()));
    std::fs::write(&file, json!({"subsystems": [bdev]}).to_string()).unwrap();
    let sock2 = common::rpc_socket();
    let mut t2 = common::Target::start(&sock2, &["-c", file.to_str().unwrap()]);
    assert_eq!(path_ports(&sock2), both);
    assert_eq!(t2.stop(), 0);
    let _ = std::fs::remove_file(&file);

    // The bdev over both paths serves I/O: exported, driven by perf
    // --verify.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    const SUB: &str = "nqn.2016-06.io.spdk:mp-rpc";
    let add_ns = json!({"nqn": SUB, "namespace": {"bdev_name": "Nvme0n1", "nsid": 1}});
    for (m, p) in [
        ("nvmf_create_transport", json!({"trtype": "TCP"})),
        (
            "nvmf_create_subsystem",
            json!({"nqn": SUB, "allow_any_host": true}),
        ),
        ("nvmf_subsystem_add_ns", add_ns.clone()),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": SUB, "listen_address":
            {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port}}),
        ),
    ] {
        let r = common::call(&sock, m, p);
        assert!(r.get("error").is_none(), "{m}: {r}");
    }
    let trid = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{SUB}");
    let verify = || {
        let args = [
            "perf",
            "-r",
            &trid,
            "-w",
            "randrw",
            "-q",
            "8",
            "-o",
            "4096",
            "--io-count",
            "2000",
            "-t",
            "20",
            "--verify",
            "--json",
        ];
        let (code, out, err) = common::pollux(&args);
        assert_eq!(code, 0, "{out}{err}");
        let v = json(&out, &err);
        assert_eq!(v["total"]["errors"], 0, "{v}");
        assert!(v["total"]["ios"].as_u64().unwrap() >= 2000, "{v}");
    };
    verify();
    // A namespace's bdev: its paths do not change under it (EBUSY).
    let d = |port: u16| {
        common::call(
            &sock,
            "bdev_nvme_detach_controller",
            json!({"name": "Nvme0", "trsvcid": port.to_string()}),
        )
    };
    let e = attach(&sock, c, Some("multipath"));
    assert_eq!(e["error"]["code"], -16, "{e}");
    assert_eq!(d(a.port)["error"]["code"], -16);
    assert_eq!(path_ports(&sock), both);
    let r = common::call(
        &sock,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": SUB, "nsid": 1}),
    );
    assert!(r.get("error").is_none(), "{r}");

    // Detach the first path: the bdev stays, over the second, and serves
    // I/O.
    assert_eq!(d(c.port)["error"]["code"], -19, "no such path");
    assert_eq!(d(a.port)["result"], true);
    assert_eq!(path_ports(&sock), [b.port.to_string()]);
    let r = common::call(&sock, "nvmf_subsystem_add_ns", add_ns);
    assert!(r.get("error").is_none(), "{r}");
    verify();
    // The last path takes the controller and its bdev with it.
    let r = common::call(
        &sock,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": SUB, "nsid": 1}),
    );
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(d(b.port)["result"], true);
    let r = common::call(&sock, "bdev_nvme_get_controllers", Value::Null);
    assert_eq!(r["result"], json!([]), "{r}");
    assert_eq!(
        common::call(&sock, "bdev_get_bdevs", Value::Null)["result"],
        json!([])
    );
    assert_eq!(t.stop(), 0);
}
