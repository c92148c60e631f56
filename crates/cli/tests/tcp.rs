//! `pollux perf`, `bdevperf` and `discover` over NVMe/TCP, against the
//! scripted loopback controller of pollux-tcp's tests.
mod common;
#[path = "../../tcp/tests/common/mod.rs"]
mod fake;

use fake::{Fake, Script, SUBNQN};

fn trid(f: &Fake, extra: &str) -> String {
    format!(
        "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{} subnqn:{SUBNQN} {extra}",
        f.addr.port()
    )
}

fn run(args: &[&str]) -> (i32, String, String) {
    common::finish(common::spawn(args), args, None)
}

fn total(json: &str, key: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(json).expect("perf --json output");
    v["total"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("total.{key} in {json}"))
}

#[test]
fn perf_verify_over_tcp() {
    for (io, extra) in [
        ("4096", ""),
        ("64k", ""),
        ("4096", "hdgst:1 ddgst:1"),
        ("64k", "hdgst:1 ddgst:1"),
    ] {
        let f = Fake::start(Script::default());
        let t = trid(&f, extra);
        let args = [
            "perf",
            "-r",
            &t,
            "-w",
            "randrw",
            "-M",
            "50",
            "-q",
            "8",
            "-o",
            io,
            "--io-count",
            "600",
            "-t",
            "50",
            "--verify",
            "--json",
        ];
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{args:?}\n{err}");
        assert_eq!(total(&out, "ios"), 600, "{out}");
        assert_eq!(total(&out, "errors"), 0, "{out}");
        let s = f.seen.lock().unwrap();
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        if io == "64k" {
            assert!(s.r2ts > 0, "64 KiB writes go through R2T");
        } else {
            assert!(s.in_capsule_writes > 0, "4 KiB writes go in the capsule");
        }
    }
}

#[test]
fn bdevperf_verify_over_tcp() {
    let f = Fake::start(Script::default());
    let t = trid(&f, "");
    let args = [
        "bdevperf",
        "--nvme",
        &t,
        "-w",
        "verify",
        "-q",
        "4",
        "-o",
        "8k",
        "--io-count",
        "800",
        "-t",
        "50",
        "--json",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(total(&out, "errors"), 0, "{out}");
    assert!(total(&out, "ios") >= 800, "{out}");
}

#[test]
fn discover_prints_the_log() {
    let f = Fake::start(Script::default());
    let port = f.addr.port().to_string();
    let t = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port}");
    let (code, out, err) = run(&["discover", &t]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Discovery Log Number of Records 1"), "{out}");
    assert!(out.contains(SUBNQN) && out.contains(&port), "{out}");
    let (code, out, _) = run(&["discover", "--json", &t]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["entries"][0]["subnqn"], SUBNQN);
}

#[test]
fn tcp_errors_name_the_culprit() {
    for (t, want) in [
        (
            "trtype:tcp traddr:127.0.0.1 subnqn:nqn.2026-01.io.pollux:x hdgst:2",
            "hdgst",
        ),
        (
            "trtype:tcp traddr:127.0.0.1 subnqn:nqn.2026-01.io.pollux:x flavour:1",
            "flavour",
        ),
        ("trtype:tcp traddr:127.0.0.1", "subnqn"),
    ] {
        let (code, _, err) = run(&["perf", "-r", t, "-t", "1"]);
        assert_eq!(code, 2, "{t}: {err}");
        assert!(err.contains(want), "{t}: {err}");
    }
    // Nobody listens: the error names the address.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let t = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:nqn.2026-01.io.pollux:x");
    let (code, _, err) = run(&["perf", "-r", &t, "-t", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let (code, _, err) = run(&["discover", "trtype:pcie", "traddr:0000:00:01.0"]);
    assert_eq!(code, 2);
    assert!(err.contains("trtype:tcp"), "{err}");
}

/// `--help` of perf (-r) and bdevperf (--nvme) shows the TCP transport
/// ID next to the local ones (before, only trtype:soft and trtype:pcie).
#[test]
fn help_shows_the_tcp_transport_id() {
    for (cmd, opt) in [("perf", "-r"), ("bdevperf", "--nvme")] {
        let (code, out, err) = run(&[cmd, "--help"]);
        assert_eq!(code, 0, "{err}");
        // The option's own line (its name first on the line: other
        // options' text may name it, e.g. --multipath's "the -r ...").
        let at = [
            format!("\n  {opt} "),
            format!("\n  {opt},"),
            format!("\n      {opt} "),
        ]
        .iter()
        .filter_map(|p| out.find(p.as_str()).map(|i| i + 1))
        .min()
        .unwrap_or_else(|| panic!("{cmd} --help has no {opt}: {out}"));
        let end = out[at..].find("\n  -").map_or(out.len(), |e| at + e);
        let text = &out[at..end];
        assert!(
            text.contains("trtype:tcp") && text.contains("subnqn:"),
            "{cmd} --help, {opt}: {text}"
        );
    }
}

/// `pollux target` on `listen` serving `img` through io_uring; its port.
fn start_target(listen: &str, img: &str) -> (std::process::Child, u16) {
    let (child, addr, _) = common::start_target(
        &[
            "--listen",
            listen,
            "--uring",
            img,
            "--nqn",
            RESTART_NQN,
            "-m",
            "0x1",
        ],
        std::process::Stdio::null(),
    );
    (child, common::port_of(&addr))
}

const RESTART_NQN: &str = "nqn.2016-06.io.pollux:restart";

/// The target is killed (SIGKILL) during a verified run and started
/// again on the same port a second later: the host holds the I/O,
/// reconnects (every second here: `reconnect_delay:1`), sends what was
/// outstanding again, and the run ends with every I/O verified and none
/// failed.
#[test]
fn perf_survives_a_target_restart() {
    let dir = std::env::temp_dir().join(format!("pollux-tcp-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("ns.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(64 << 20))
        .unwrap();
    let img = img.to_str().unwrap().to_string();
    let (mut target, port) = start_target("127.0.0.1:0", &img);
    let t = format!(
        "trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{RESTART_NQN} reconnect_delay:1 ctrl_loss_tmo:30"
    );
    let args = [
        "perf", "-r", &t, "-w", "randrw", "-M", "50", "-q", "16", "-o", "4096", "-t", "5",
        "--verify", "--json",
    ];
    let perf = common::spawn(&args);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    target.kill().unwrap(); // SIGKILL
    target.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (mut target, again) = start_target(&format!("127.0.0.1:{port}"), &img);
    assert_eq!(again, port);
    let (code, out, err) = common::finish(perf, &args, None);
    let _ = target.kill();
    let _ = target.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{err}");
    assert_eq!(total(&out, "errors"), 0, "{out}\n{err}");
    assert!(total(&out, "ios") > 0, "{out}");
    // The restart did happen under the run: the host reset and reconnected.
    assert!(err.contains("resetting controller"), "{err}");
    assert!(err.contains("reconnecting"), "{err}");
}

const GONE_NQN: &str = "nqn.2016-06.io.pollux:gone";

/// The target is killed under a run at -q 64 and does not come back
/// (`ctrl_loss_tmo:1`): every I/O in flight fails the same way, then
/// every resubmission is refused. perf and bdevperf log each kind of
/// error once and count the repeats (they used to log a line per I/O, up
/// to ten, and list them all again in the report).
#[test]
fn a_target_gone_for_good_logs_each_error_once_with_a_count() {
    for tool in ["perf", "bdevperf"] {
        let (mut target, addr, _) = common::start_target(
            &[
                "--listen",
                "127.0.0.1:0",
                "--null",
                "64MiB",
                "--nqn",
                GONE_NQN,
                "-m",
                "0x1",
            ],
            std::process::Stdio::null(),
        );
        let port = common::port_of(&addr);
        let t = format!(
            "trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{GONE_NQN} reconnect_delay:1 ctrl_loss_tmo:1"
        );
        let dev = if tool == "perf" { "-r" } else { "--nvme" };
        let args = [tool, dev, &t, "-q", "64", "-t", "4"];
        let run = common::spawn(&args);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        target.kill().unwrap(); // SIGKILL
        target.wait().unwrap();
        let (code, out, err) = common::finish(run, &args, None);
        assert_ne!(code, 0, "{tool}: {out}\n{err}");
        let failed = err.lines().filter(|l| l.contains("I/O failed")).count();
        assert!(
            (1..=2).contains(&failed),
            "{tool}: {failed} 'I/O failed' lines (the first, then its count):\n{err}"
        );
        let refused = err.lines().filter(|l| l.contains("submit at LBA")).count();
        assert!(refused <= 2, "{tool}: {refused} refusal lines:\n{err}");
        // The count: how many more failed the same way, in the log and in
        // the report.
        let repeated = |text: &str| {
            text.lines()
                .filter(|l| l.contains("I/O failed"))
                .find_map(|l| {
                    let n = l.split("(repeated ").nth(1)?.split(' ').next()?;
                    n.parse::<u64>().ok()
                })
        };
        let n = repeated(&err).unwrap_or_else(|| panic!("{tool}: no count:\n{err}"));
        assert!(
            (10..64).contains(&n),
            "{tool}: repeated {n} more times:\n{err}"
        );
        assert_eq!(
            repeated(&out),
            Some(n),
            "{tool}: the report's count:\n{out}"
        );
    }
}
