//! `pollux target`'s JSON-RPC server driven by SPDK's own client
//! (`spdk-rpc` of PyPI's `spdk` package, installed into a venv that is
//! kept for reruns), and the socket's rules: owner-only, one app per
//! socket (a second is refused with a clear error while the first keeps
//! serving), removed on exit.
mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::{call, Target};
use serde_json::{json, Value};

/// The PyPI package of SPDK's client, pinned: what this test was written
/// against (its command is `spdk-rpc`).
const SPDK_PY: &str = "spdk==26.9";

/// Where the venv is kept between runs (`POLLUX_SPDK_VENV` overrides).
fn venv_dir() -> PathBuf {
    std::env::var_os("POLLUX_SPDK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/var/tmp/pollux-spdk-venv-{}",
                SPDK_PY.replace("==", "-")
            ))
        })
}

/// `spdk-rpc` from the venv, made on first use; None (with the reason
/// printed) when it cannot be installed (no PyPI, no python3-venv).
fn spdk_rpc() -> Option<PathBuf> {
    static RPC: OnceLock<Option<PathBuf>> = OnceLock::new();
    RPC.get_or_init(|| {
        let dir = venv_dir();
        let bin = dir.join("bin/spdk-rpc");
        if bin.exists() {
            return Some(bin);
        }
        // Built aside and renamed into place: concurrent runs never see
        // half a venv.
        let tmp = PathBuf::from(format!("{}.tmp-{}", dir.display(), std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let ok = |c: &mut Command, what: &str| -> bool {
            match c.output() {
                Ok(o) if o.status.success() => true,
                Ok(o) => {
                    eprintln!(
                        "skipped the spdk-rpc part: {what} failed: {}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    );
                    false
                }
                Err(e) => {
                    eprintln!("skipped the spdk-rpc part: {what}: {e}");
                    false
                }
            }
        };
        let made = ok(
            Command::new("python3").args(["-m", "venv"]).arg(&tmp),
            "python3 -m venv (apt-get install python3-venv)",
        ) && ok(
            Command::new(tmp.join("bin/pip")).args([
                "install",
                "-q",
                "--disable-pip-version-check",
                "--timeout",
                "30",
                SPDK_PY,
            ]),
            &format!("pip install {SPDK_PY} (is PyPI reachable?)"),
        );
        if !made {
            let _ = std::fs::remove_dir_all(&tmp);
            return None;
        }
        // The venv's scripts name their interpreter by path: the venv is
        // made again in place (same python, packages kept).
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        } else if !ok(
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
            "python3 -m venv (in place)",
        ) {
            return None;
        }
        // Scripts still name the temporary path: rewrite their shebangs.
        for e in std::fs::read_dir(dir.join("bin")).ok()?.flatten() {
            let p = e.path();
            if let Ok(text) = std::fs::read_to_string(&p) {
                let t = tmp.display().to_string();
                if text.contains(&t) {
                    let _ = std::fs::write(&p, text.replace(&t, &dir.display().to_string()));
                }
            }
        }
        bin.exists().then_some(bin)
    })
    .clone()
}

/// `spdk-rpc -s SOCK ARGS`: exit code and stdout + stderr.
fn rpc(bin: &Path, sock: &str, args: &[&str]) -> (i32, String) {
    let o = Command::new(bin)
        .arg("-s")
        .arg(sock)
        .args(args)
        .output()
        .expect("run spdk-rpc");
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `spdk-rpc ARGS` that must succeed; its JSON output (or its text as a
/// JSON string).
fn ok(bin: &Path, sock: &str, args: &[&str]) -> Value {
    let (code, out) = rpc(bin, sock, args);
    assert_eq!(code, 0, "spdk-rpc {args:?}: {out}");
    serde_json::from_str(&out).unwrap_or_else(|_| Value::String(out.trim().to_string()))
}

/// The `"code"` of a failed `spdk-rpc ARGS`, and its output.
fn refused(bin: &Path, sock: &str, args: &[&str]) -> (i64, String) {
    let (code, out) = rpc(bin, sock, args);
    assert_ne!(code, 0, "spdk-rpc {args:?} succeeded: {out}");
    let c = out
        .split("\"code\":")
        .nth(1)
        .and_then(|r| r.trim().split([',', '\n', '}']).next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no error code in: {out}"));
    (c, out)
}

#[test]
fn spdks_client_drives_an_empty_target() {
    let sock = common::rpc_socket();
    let mut t = Target::start(&sock, &[]);
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only socket");

    // Without SPDK's client: a raw request, and a bad parameter named.
    let v = call(&sock, "spdk_get_version", Value::Null);
    assert!(v["result"]["version"]
        .as_str()
        .unwrap()
        .starts_with("pollux"));
    let e = call(
        &sock,
        "bdev_null_create",
        json!({"name": "X", "num_blocks": "many", "block_size": 512}),
    );
    assert_eq!(e["error"]["code"], -32602, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("num_blocks"),
        "{e}"
    );

    let Some(bin) = spdk_rpc() else {
        return;
    };
    let bin = bin.as_path();
    let s = t.sock.clone();
    let s = s.as_str();
    let v = ok(bin, s, &["spdk_get_version"]);
    assert!(
        v["version"].as_str().unwrap().starts_with("pollux v"),
        "{v}"
    );
    let methods = ok(bin, s, &["rpc_get_methods"]);
    for m in [
        "spdk_get_version",
        "rpc_get_methods",
        "framework_wait_init",
        "framework_get_reactors",
        "thread_get_stats",
        "bdev_null_create",
        "bdev_null_delete",
        "bdev_malloc_create",
        "bdev_malloc_delete",
        "bdev_uring_create",
        "bdev_uring_delete",
        "bdev_nvme_attach_controller",
        "bdev_nvme_detach_controller",
        "bdev_get_bdevs",
        "bdev_get_iostat",
        "save_config",
    ] {
        assert!(
            methods.as_array().unwrap().iter().any(|x| x == m),
            "{m} in {methods}"
        );
    }
    ok(bin, s, &["framework_wait_init"]);
    assert_eq!(
        ok(bin, s, &["bdev_null_create", "Null0", "64", "512"]),
        "Null0"
    );
    assert_eq!(
        ok(bin, s, &["bdev_malloc_create", "-b", "Mal0", "32", "512"]),
        "Mal0"
    );
    // An unnamed malloc bdev gets SPDK's made-up name.
    assert_eq!(ok(bin, s, &["bdev_malloc_create", "8", "4096"]), "Malloc0");
    let bdevs = ok(bin, s, &["bdev_get_bdevs"]);
    let b = |name: &str| {
        bdevs
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {bdevs}"))
            .clone()
    };
    let null = b("Null0");
    assert_eq!(
        (null["num_blocks"].as_u64(), null["block_size"].as_u64()),
        (Some(131072), Some(512))
    );
    assert_eq!(null["product_name"], "Null disk");
    assert_eq!(null["claimed"], false);
    assert_eq!(null["supported_io_types"]["read"], true);
    assert_eq!(b("Mal0")["product_name"], "Malloc disk");
    assert_eq!(b("Mal0")["num_blocks"], 65536);
    let one = ok(bin, s, &["bdev_get_bdevs", "-b", "Mal0"]);
    assert_eq!(one.as_array().unwrap().len(), 1);
    let st = ok(bin, s, &["bdev_get_iostat"]);
    assert_eq!(st["tick_rate"], 1_000_000_000u64);
    assert!(st["ticks"].is_u64());
    let n0 = st["bdevs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "Null0")
        .unwrap();
    for f in [
        "bytes_read",
        "num_read_ops",
        "bytes_written",
        "num_write_ops",
    ] {
        assert_eq!(n0[f], 0, "{f} in {n0}");
    }
    let th = ok(bin, s, &["thread_get_stats"]);
    let t0 = &th["threads"][0];
    assert!(
        t0["busy"].is_u64() && t0["idle"].is_u64() && t0["name"].is_string(),
        "{th}"
    );
    let r = ok(bin, s, &["framework_get_reactors"]);
    assert_eq!(r["reactors"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["pid"], t.child.id());
    // save_config (SPDK's client composes it from framework_get_config).
    let saved = ok(bin, s, &["save_config"]);
    let bdev_cfg = saved["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["subsystem"] == "bdev")
        .expect("bdev subsystem")["config"]
        .clone();
    assert_eq!(bdev_cfg.as_array().unwrap().len(), 3, "{bdev_cfg}");
    assert_eq!(bdev_cfg[0]["method"], "bdev_null_create");
    assert_eq!(bdev_cfg[0]["params"]["uuid"], null["uuid"]);

    // An unknown method (one SPDK's client knows): -32601.
    let (c, out) = refused(bin, s, &["bdev_split_create", "Null0", "2"]);
    assert_eq!(c, -32601, "{out}");
    // A bad parameter: -32602 naming it.
    let (c, out) = refused(
        bin,
        s,
        &["bdev_null_create", "Null1", "64", "512", "-m", "8"],
    );
    assert_eq!(c, -32602, "{out}");
    assert!(out.contains("md_size"), "{out}");
    // A name in use: -17 (EEXIST).
    let (c, out) = refused(bin, s, &["bdev_null_create", "Null0", "64", "512"]);
    assert_eq!(c, -17, "{out}");
    // Deletes; a delete of the wrong kind or of nothing: -19 (ENODEV).
    let (c, out) = refused(bin, s, &["bdev_null_delete", "Mal0"]);
    assert_eq!(c, -19, "{out}");
    ok(bin, s, &["bdev_null_delete", "Null0"]);
    ok(bin, s, &["bdev_malloc_delete", "Mal0"]);
    ok(bin, s, &["bdev_malloc_delete", "Malloc0"]);
    assert_eq!(ok(bin, s, &["bdev_get_bdevs"]), json!([]));
    let (c, _) = refused(bin, s, &["bdev_malloc_delete", "Mal0"]);
    assert_eq!(c, -19);
    assert_eq!(t.stop(), 0);
    assert!(!Path::new(s).exists(), "the socket is removed on exit");
}

/// A config file's bdevs and RPC-made ones are alike: save_config writes
/// both, and the target restarts from it with the same bdevs.
#[test]
fn save_config_restarts_the_target_with_the_same_bdevs() {
    let sock = common::rpc_socket();
    let mut t = Target::start(&sock, &["--ram", "4MiB", "--listen", "127.0.0.1:0"]);
    let e = call(&sock, "bdev_malloc_delete", json!({"name": "Malloc0"}));
    assert_eq!(e["error"]["code"], -16, "a namespace's bdev is in use: {e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nqn.2016-06.io.pollux:cnode1"),
        "{e}"
    );
    let r = call(
        &sock,
        "bdev_null_create",
        json!({"name": "N", "num_blocks": 64, "block_size": 4096}),
    );
    assert_eq!(r["result"], "N", "{r}");
    let saved = call(&sock, "save_config", Value::Null)["result"].clone();
    let before = call(&sock, "bdev_get_bdevs", Value::Null)["result"].clone();
    assert_eq!(t.stop(), 0);
    // Only the bdev part: the nvmf part is the target's own to restore.
    let bdev_only = json!({"subsystems": [saved["subsystems"][0].clone()]});
    let dir = std::env::temp_dir().join(format!("pollux-rpc-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("saved.json");
    std::fs::write(&file, bdev_only.to_string()).unwrap();
    let sock2 = common::rpc_socket();
    let mut t2 = Target::start(&sock2, &["-c", file.to_str().unwrap()]);
    let after = call(&sock2, "bdev_get_bdevs", Value::Null)["result"].clone();
    let key = |v: &Value| -> Vec<(String, u64, u64, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().to_string(),
                    b["block_size"].as_u64().unwrap(),
                    b["num_blocks"].as_u64().unwrap(),
                    b["uuid"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(key(&before), key(&after));
    assert_eq!(t2.stop(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second target, or a bdevperf, on a socket a live target serves is
/// refused with a clear error naming the path; the first keeps serving.
#[test]
fn a_second_app_on_a_live_socket_is_refused_and_the_first_keeps_serving() {
    let sock = common::rpc_socket();
    let _t = Target::start(&sock, &[]);
    let want = format!(
        "RPC socket {sock} is in use by another process (another target running? give -r PATH)"
    );
    let (code, out, err) = common::pollux(&["target", "-r", &sock]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(&want), "{err}");
    let (code, out, err) = common::pollux(&["bdevperf", "-r", &sock, "--null", "-t", "1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(&want), "{err}");
    let v = call(&sock, "spdk_get_version", Value::Null);
    assert!(v["result"].is_object(), "the first still answers: {v}");
    // A regular file at the path is refused and left alone.
    let file = format!("{sock}.file");
    std::fs::write(&file, b"keep").unwrap();
    let (code, _, err) = common::pollux(&["target", "-r", &file]);
    assert_eq!(code, 2);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    let _ = std::fs::remove_file(&file);
}

/// bdevperf serves its bdevs' statistics while it runs.
#[test]
fn bdevperf_serves_iostat_while_it_runs() {
    let sock = common::rpc_socket();
    let core = common::allowed_cores()[0].to_string();
    let mask = if core == "0" {
        "0x1".to_string()
    } else {
        format!("[{core}]")
    };
    let child = common::spawn(&[
        "bdevperf", "-r", &sock, "--null", "-m", &mask, "-t", "3", "-q", "8",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !Path::new(&sock).exists() {
        assert!(std::time::Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut reads = 0;
    while std::time::Instant::now() < deadline {
        let Ok(_) = UnixStream::connect(&sock) else {
            break;
        };
        let st = call(&sock, "bdev_get_iostat", Value::Null);
        reads = st["result"]["bdevs"][0]["num_read_ops"]
            .as_u64()
            .unwrap_or(0);
        if reads > 0 {
            let th = call(&sock, "thread_get_stats", Value::Null);
            assert!(
                th["result"]["threads"][0]["busy"].as_u64().unwrap() > 0,
                "{th}"
            );
            let e = call(
                &sock,
                "bdev_null_create",
                json!({"name": "x", "num_blocks": 8, "block_size": 512}),
            );
            assert_eq!(e["error"]["code"], -32601, "bdevperf creates no bdevs: {e}");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(reads > 0, "iostat counted the run's reads");
    let (code, out, err) = common::finish(child, &["bdevperf"], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!Path::new(&sock).exists(), "the socket is removed on exit");
}

/// uring and NVMe bdevs by RPC: an io_uring file, an emulated NVMe
/// controller attached and detached (its bdevs `<name>n<nsid>`), and
/// save_config writing both.
#[test]
fn uring_and_nvme_bdevs_by_rpc() {
    let sock = common::rpc_socket();
    let _t = Target::start(&sock, &[]);
    let file = format!("{sock}.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let r = call(
        &sock,
        "bdev_uring_create",
        json!({"name": "U0", "filename": file, "block_size": 512}),
    );
    assert_eq!(r["result"], "U0", "{r}");
    let b = call(&sock, "bdev_get_bdevs", json!({"name": "U0"}));
    assert_eq!(b["result"][0]["num_blocks"], 2048, "{b}");
    let r = call(
        &sock,
        "bdev_nvme_attach_controller",
        json!({"name": "Emu", "trtype": "soft", "backend": "ram", "size": "8MiB"}),
    );
    assert_eq!(r["result"], json!(["Emun1"]), "{r}");
    let again = call(
        &sock,
        "bdev_nvme_attach_controller",
        json!({"name": "Emu", "trtype": "soft", "backend": "ram", "size": "8MiB"}),
    );
    assert_eq!(again["error"]["code"], -17, "{again}");
    let b = call(&sock, "bdev_get_bdevs", json!({"name": "Emun1"}));
    assert_eq!(b["result"][0]["product_name"], "NVMe disk", "{b}");
    let saved = call(&sock, "save_config", Value::Null)["result"].clone();
    let methods: Vec<&str> = saved["subsystems"][0]["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["bdev_uring_create", "bdev_nvme_attach_controller"]
    );
    // A controller's bdev is deleted by detaching the controller.
    let e = call(&sock, "bdev_malloc_delete", json!({"name": "Emun1"}));
    assert_eq!(e["error"]["code"], -19, "{e}");
    let r = call(&sock, "bdev_nvme_detach_controller", json!({"name": "Emu"}));
    assert_eq!(r["result"], true, "{r}");
    let r = call(&sock, "bdev_nvme_detach_controller", json!({"name": "Emu"}));
    assert_eq!(r["error"]["code"], -19, "{r}");
    assert_eq!(
        call(&sock, "bdev_uring_delete", json!({"name": "U0"}))["result"],
        true
    );
    assert_eq!(
        call(&sock, "bdev_get_bdevs", Value::Null)["result"],
        json!([])
    );
    let _ = std::fs::remove_file(&file);
}

/// `GET path` over HTTP/1.1: status line and body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to --metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("headers");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// `--metrics`: the bdev and thread counters of bdev_get_iostat and
/// thread_get_stats, and the target's gauges, in Prometheus' text format;
/// the counters move with I/O.
#[test]
fn metrics_serve_the_counters_in_prometheus_text_format() {
    let sock = common::rpc_socket();
    let t = Target::start(
        &sock,
        &[
            "--ram",
            "4MiB",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let find = |prefix: &str| {
        t.lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line: {:?}", t.lines))
            .to_string()
    };
    let listen = find("pollux target: listening on ");
    let url = find("pollux target: metrics on http://");
    let addr = url.trim_end_matches("/metrics").to_string();
    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    for want in [
        "# TYPE pollux_bdev_read_ops_total counter",
        "pollux_bdev_read_ops_total{bdev=\"Malloc0\"} 0",
        "pollux_bdev_written_bytes_total{bdev=\"Malloc0\"} 0",
        "# TYPE pollux_thread_busy_seconds_total counter",
        "pollux_target_connections 0",
        "pollux_target_controllers 0",
        "# TYPE pollux_target_buffer_bytes gauge",
        "# TYPE pollux_target_io_qpairs gauge",
    ] {
        assert!(body.contains(want), "{want:?} in:\n{body}");
    }
    assert!(
        body.contains("pollux_thread_busy_seconds_total{thread=\"0\",core=\""),
        "{body}"
    );
    // Reads through the target show in the counters.
    let port = common::port_of(&listen);
    let trid = format!(
        "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:nqn.2016-06.io.pollux:cnode1"
    );
    let (code, out, err) = common::pollux(&[
        "perf",
        "-r",
        &trid,
        "-w",
        "randread",
        "-q",
        "4",
        "-o",
        "4096",
        "--io-count",
        "100",
        "-t",
        "5",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, body) = http_get(&addr, "/metrics");
    let reads: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("pollux_bdev_read_ops_total{bdev=\"Malloc0\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no read counter in:\n{body}"));
    assert!(reads >= 100.0, "{reads} reads");
    let st = call(&sock, "bdev_get_iostat", json!({"name": "Malloc0"}));
    assert_eq!(
        st["result"]["bdevs"][0]["num_read_ops"].as_f64(),
        Some(reads),
        "{st}"
    );
    let (status, _) = http_get(&addr, "/nope");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

/// `pollux perf --json` totals: `key` of `total`.
fn perf_total(json: &str, key: &str) -> u64 {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|_| panic!("perf --json: {json}"));
    v["total"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("total.{key} in {json}"))
}

/// The issue's "done means", with SPDK's own client: an empty target
/// configured into an NVMe/TCP subsystem over a malloc bdev, driven by
/// `pollux perf --verify`, then taken apart again; add_ns of an unknown
/// bdev or of one already a namespace refused, naming the bdev.
#[test]
fn spdks_client_configures_a_subsystem_perf_drives_and_tears_it_down() {
    let Some(bin) = spdk_rpc() else {
        return;
    };
    let bin = bin.as_path();
    let sock = common::rpc_socket();
    let mut t = Target::start(&sock, &[]);
    let s = sock.as_str();
    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    ok(bin, s, &["nvmf_create_transport", "-t", "TCP"]);
    assert_eq!(
        ok(bin, s, &["bdev_malloc_create", "-b", "Mal0", "64", "512"]),
        "Mal0"
    );
    ok(
        bin,
        s,
        &[
            "nvmf_create_subsystem",
            NQN,
            "-a",
            "-s",
            "SPDK00000000000001",
        ],
    );
    // SPDK's client prints nothing here (the NSID is in the listing).
    ok(bin, s, &["nvmf_subsystem_add_ns", NQN, "Mal0"]);
    ok(
        bin,
        s,
        &[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ],
    );
    // Refusals name the bdev: unknown, and already a namespace.
    let (c, out) = refused(bin, s, &["nvmf_subsystem_add_ns", NQN, "Nope0"]);
    assert_eq!(c, -32602, "{out}");
    assert!(out.contains("Nope0"), "{out}");
    let (c, out) = refused(bin, s, &["nvmf_subsystem_add_ns", NQN, "Mal0"]);
    assert_eq!(c, -32602, "{out}");
    assert!(out.contains("Mal0"), "{out}");
    let subs = ok(bin, s, &["nvmf_get_subsystems"]);
    let sub = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["nqn"] == NQN)
        .unwrap_or_else(|| panic!("{NQN} in {subs}"));
    assert_eq!(sub["serial_number"], "SPDK00000000000001", "{sub}");
    assert_eq!(sub["allow_any_host"], true, "{sub}");
    let ns = sub["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 1, "{sub}");
    assert_eq!(
        (ns[0]["nsid"].as_u64(), ns[0]["bdev_name"].as_str()),
        (Some(1), Some("Mal0"))
    );
    let l = &sub["listen_addresses"][0];
    assert_eq!(
        (
            l["trtype"].as_str().map(str::to_uppercase),
            l["traddr"].as_str(),
            l["trsvcid"].as_str()
        ),
        (Some("TCP".into()), Some("127.0.0.1"), Some(port.as_str())),
        "{sub}"
    );
    let bdevs = ok(bin, s, &["bdev_get_bdevs", "-b", "Mal0"]);
    assert_eq!(bdevs[0]["claimed"], true, "{bdevs}");

    let trid = format!("trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}");
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
    assert_eq!(perf_total(&out, "errors"), 0, "{out}");
    assert!(perf_total(&out, "ios") >= 2000, "{out}");

    // A namespace's bdev is in use (EBUSY, naming the subsystem).
    let (c, out) = refused(bin, s, &["bdev_malloc_delete", "Mal0"]);
    assert_eq!(c, -16, "{out}");
    assert!(out.contains(NQN), "{out}");
    // Nothing connected now: taken apart.
    ok(bin, s, &["nvmf_subsystem_remove_ns", NQN, "1"]);
    let bdevs = ok(bin, s, &["bdev_get_bdevs", "-b", "Mal0"]);
    assert_eq!(bdevs[0]["claimed"], false, "{bdevs}");
    let subs = ok(bin, s, &["nvmf_get_subsystems"]);
    let sub = subs.as_array().unwrap().iter().find(|x| x["nqn"] == NQN);
    assert_eq!(
        sub.map(|x| x["namespaces"].clone()),
        Some(json!([])),
        "{subs}"
    );
    ok(bin, s, &["nvmf_delete_subsystem", NQN]);
    ok(bin, s, &["bdev_malloc_delete", "Mal0"]);
    assert_eq!(ok(bin, s, &["bdev_get_bdevs"]), json!([]));
    let subs = ok(bin, s, &["nvmf_get_subsystems"]);
    assert!(
        !subs.as_array().unwrap().iter().any(|x| x["nqn"] == NQN),
        "{subs}"
    );
    assert_eq!(t.stop(), 0);
}

/// A namespace added and removed live while `pollux perf --verify` drives
/// NSID 1 of the same subsystem: the connected host is not disturbed (no
/// errors), and the subsystem lists its controller and queue pairs
/// meanwhile.
#[test]
fn a_live_namespace_change_leaves_a_running_perf_undisturbed() {
    const NQN: &str = "nqn.2016-06.io.pollux:cnode1";
    let sock = common::rpc_socket();
    let t = Target::start(&sock, &["--ram", "4MiB", "--listen", "127.0.0.1:0"]);
    let listen = t
        .lines
        .iter()
        .find_map(|l| l.strip_prefix("pollux target: listening on "))
        .unwrap_or_else(|| panic!("no listening line: {:?}", t.lines))
        .to_string();
    let port = common::port_of(&listen);
    let trid = format!("trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}");
    let args = [
        "perf", "-r", &trid, "-w", "randrw", "-q", "8", "-o", "4096", "-t", "4", "--verify",
        "--json",
    ];
    let perf = common::spawn(&args);
    // Wait for perf's I/O queue pair.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let qpairs = loop {
        let q = call(&sock, "nvmf_subsystem_get_qpairs", json!({"nqn": NQN}));
        if q["result"].as_array().is_some_and(|a| a.len() >= 2) {
            break q["result"].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "perf never connected: {q}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        qpairs.as_array().unwrap().iter().any(|q| q["qid"] == 0)
            && qpairs.as_array().unwrap().iter().any(|q| q["qid"] == 1),
        "{qpairs}"
    );
    let ctrls = call(&sock, "nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
    assert_eq!(ctrls["result"].as_array().map(Vec::len), Some(1), "{ctrls}");
    assert!(ctrls["result"][0]["hostnqn"].is_string(), "{ctrls}");
    // The live change, while perf runs.
    let r = call(
        &sock,
        "bdev_malloc_create",
        json!({"name": "Mal1", "num_blocks": 2048, "block_size": 512}),
    );
    assert_eq!(r["result"], "Mal1", "{r}");
    let r = call(
        &sock,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Mal1"}}),
    );
    assert_eq!(r["result"], 2, "{r}");
    let subs = call(&sock, "nvmf_get_subsystems", json!({"nqn": NQN}));
    let nsids: Vec<u64> = subs["result"][0]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["nsid"].as_u64())
        .collect();
    assert_eq!(nsids, [1, 2], "{subs}");
    std::thread::sleep(Duration::from_millis(300));
    let r = call(
        &sock,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN, "nsid": 2}),
    );
    assert_eq!(r["result"], true, "{r}");
    let r = call(&sock, "bdev_malloc_delete", json!({"name": "Mal1"}));
    assert_eq!(r["result"], true, "{r}");
    let still = call(&sock, "nvmf_subsystem_get_controllers", json!({"nqn": NQN}));
    assert_eq!(still["result"].as_array().map(Vec::len), Some(1), "{still}");
    let (code, out, err) = common::finish(perf, &args, None);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(perf_total(&out, "errors"), 0, "{out}\n{err}");
    assert!(perf_total(&out, "ios") > 0, "{out}");
    let devs = perf_devices(&out);
    assert_eq!(devs.len(), 1, "{devs:?}");
    assert!(
        devs[0].contains(&format!("{NQN} NSID 1 qpair 0")),
        "{devs:?}"
    );
}

/// `pollux perf --json`'s device names.
fn perf_devices(json: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|_| panic!("perf --json: {json}"));
    v["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("devices in {json}"))
        .iter()
        .map(|d| d["name"].as_str().unwrap_or_default().to_string())
        .collect()
}
