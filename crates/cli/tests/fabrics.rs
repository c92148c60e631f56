//! NVMe over Fabrics as a user meets it, against `pollux target`:
//! refused Connects said as what went wrong (host and target side),
//! `bdevperf -c` with a TCP controller, what the target prints when it
//! starts, names and ports checked where they are given.
mod common;

use std::io::BufRead;
use std::process::Stdio;

const NQN: &str = "nqn.2024-01.io.pollux:fabrics-test";
const HOST: &str = "nqn.2014-08.org.example:allowed";
const OTHER: &str = "nqn.2014-08.org.example:stranger";

/// `pollux target` in the background (its stderr to `log`, if given);
/// killed on drop.
struct Served {
    child: std::process::Child,
    port: u16,
    /// stdout after the first line.
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Served {
    fn start(extra: &[&str], log: Option<&std::path::Path>) -> Served {
        let mut args = vec!["--listen", "127.0.0.1:0", "--ram", "64MiB", "--nqn", NQN];
        args.extend_from_slice(&["-m", "0x1"]);
        args.extend_from_slice(extra);
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).expect("target log")),
            None => Stdio::null(),
        };
        let (child, addr, out) = common::start_target(&args, stderr);
        Served {
            port: common::port_of(&addr),
            child,
            out,
        }
    }

    fn trid(&self, nqn: &str, extra: &str) -> String {
        format!(
            "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{} subnqn:{nqn} {extra}",
            self.port
        )
    }

    /// Stops the target (SIGTERM) and returns the rest of its stdout.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on the child we spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        rest
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("pollux-fabrics-{}-{name}", std::process::id()))
}

/// A loopback port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn perf(trid: &str) -> (i32, String, String) {
    common::pollux(&["perf", "-r", trid, "-t", "1", "-q", "4", "-c", "0"])
}

/// A subsystem the target does not serve and a host it does not allow:
/// each refusal says what went wrong and what to do, keeps the raw
/// status at its end, and the target warns naming the peer, the NQNs and
/// the reason. Before: "Connect failed: Attempted Write to Read Only
/// Range (sct 0x1, sc 0x82, dnr)" and "Connect failed: status (sct 0x1,
/// sc 0x84, dnr)", and the target logged the unknown subsystem at INFO
/// only.
#[test]
fn refused_connects_say_what_went_wrong_on_both_sides() {
    let log = temp("refused.log");
    let t = Served::start(&["--host", HOST], Some(&log));
    let nothere = "nqn.2016-06.io.pollux:nothere";
    let (code, _, err) = perf(&t.trid(nothere, &format!("hostnqn:{HOST}")));
    assert_eq!(code, 2, "{err}");
    let want = format!(
        "Connect refused: subsystem {nothere} is not served at 127.0.0.1:{}; `pollux discover` lists what this host may reach",
        t.port
    );
    assert!(err.contains(&want), "{err}");
    assert!(err.contains("(sct 0x1, sc 0x82, dnr)"), "{err}");
    assert!(!err.contains("Read Only"), "{err}");

    let (code, _, err) = perf(&t.trid(NQN, &format!("hostnqn:{OTHER}")));
    assert_eq!(code, 2, "{err}");
    let want = format!(
        "Connect refused: host {OTHER} is not allowed by subsystem {NQN} at 127.0.0.1:{}",
        t.port
    );
    assert!(err.contains(&want), "{err}");
    assert!(
        err.contains("[Connect Invalid Host (sct 0x1, sc 0x84, dnr)]"),
        "{err}"
    );

    // The allowed host gets in.
    let (code, _, err) = perf(&t.trid(NQN, &format!("hostnqn:{HOST}")));
    assert_eq!(code, 0, "{err}");

    t.stop();
    let warned = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let refused: Vec<&str> = warned
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Connect refused"))
        .collect();
    assert!(
        refused.iter().any(|l| l.contains("unknown subsystem")
            && l.contains("peer=127.0.0.1:")
            && l.contains(nothere)
            && l.contains(HOST)),
        "no warning for the unknown subsystem:\n{warned}"
    );
    assert!(
        refused.iter().any(|l| l.contains("host not allowed")
            && l.contains("peer=127.0.0.1:")
            && l.contains(NQN)
            && l.contains(OTHER)),
        "no warning for the host not allowed:\n{warned}"
    );
    assert_eq!(refused.len(), 2, "one warning per refusal:\n{warned}");
}

fn attach_json(port: u16) -> String {
    format!(
        r#"{{"subsystems": [{{"subsystem": "bdev", "config": [
  {{"method": "bdev_nvme_attach_controller", "params": {{"name": "Nvme0", "trtype": "tcp", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": "{NQN}"}}}}]}}]}}"#
    )
}

/// `bdevperf -c FILE` whose configuration attaches one TCP controller
/// runs against `pollux target` (before issue 19: refused, "trtype:tcp
/// cannot be mixed with trtype:soft/pcie controllers in one run").
#[test]
fn bdevperf_config_attaches_a_tcp_controller() {
    let t = Served::start(&[], None);
    let path = temp("attach.json");
    std::fs::write(&path, attach_json(t.port)).unwrap();
    let p = path.display().to_string();
    let (code, out, err) = common::pollux(&[
        "bdevperf",
        "-c",
        &p,
        "-w",
        "verify",
        "-o",
        "4096",
        "-q",
        "16",
        "-t",
        "50",
        "--io-count",
        "2000",
        "--json",
        "-m",
        "0x1",
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bdevperf --json");
    assert_eq!(v["total"]["errors"], 0, "{out}");
    assert!(v["total"]["ios"].as_u64() >= Some(2000), "{out}");
}

/// A controller of `-c` that cannot be reached is named once (before:
/// "bdev_nvme_attach_controller 'Nvme0': bdev_nvme_attach_controller
/// 'Nvme0': ..."), in bdevperf and in the target.
#[test]
fn an_attach_failure_names_the_controller_once() {
    let port = closed_port();
    let path = temp("refused.json");
    std::fs::write(&path, attach_json(port)).unwrap();
    let p = path.display().to_string();
    for args in [
        &[
            "bdevperf", "-c", &p, "-w", "randread", "-t", "1", "-m", "0x1",
        ][..],
        &["target", "-c", &p, "-m", "0x1"][..],
    ] {
        let (code, _, err) = common::pollux(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(
            err.matches("bdev_nvme_attach_controller 'Nvme0'").count(),
            1,
            "{args:?}: {err}"
        );
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }
    let _ = std::fs::remove_file(&path);
}

/// Reads the banner: stdout lines after "listening on", until "cores:".
fn banner(out: &mut impl BufRead) -> Vec<String> {
    let mut lines = Vec::new();
    for l in out.lines() {
        let l = l.expect("target stdout");
        let done = l.contains("cores:");
        lines.push(l);
        if done {
            break;
        }
    }
    lines
}

/// `pollux target` says what it serves when it starts: subsystems,
/// namespaces (NSID, bdev, size, block size), listeners, hosts, cores;
/// in quick mode and with `-c`.
#[test]
fn the_target_prints_what_it_serves() {
    let mut t = Served::start(&["--host", HOST, "--block-size", "4096"], None);
    let b = banner(&mut t.out);
    let port = t.port;
    // (The first line, "listening on", was read by start_target.)
    assert_eq!(
        b,
        [
            format!("pollux target: subsystem {NQN}"),
            "pollux target:   namespace 1: Malloc0, 64 MiB (16384 x 4096 B)".into(),
            format!("pollux target:   listeners: 127.0.0.1:{port}"),
            format!("pollux target:   hosts: {HOST}"),
            "pollux target: discovery: nqn.2014-08.org.nvmexpress.discovery on every listener"
                .into(),
            "pollux target: cores: 0 (1 thread)".into(),
        ]
    );
    drop(t);

    let path = temp("banner.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"subsystems": [
  {{"subsystem": "bdev", "config": [
    {{"method": "bdev_malloc_create", "params": {{"name": "Malloc0", "num_blocks": 2048, "block_size": 512}}}},
    {{"method": "bdev_null_create", "params": {{"name": "Null0", "num_blocks": 262144, "block_size": 4096}}}}]}},
  {{"subsystem": "nvmf", "config": [
    {{"method": "nvmf_create_subsystem", "params": {{"nqn": "{NQN}", "allow_any_host": true}}}},
    {{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{NQN}", "namespace": {{"bdev_name": "Null0", "nsid": 2}}}}}},
    {{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{NQN}", "namespace": {{"bdev_name": "Malloc0", "nsid": 1}}}}}},
    {{"method": "nvmf_subsystem_add_listener", "params": {{"nqn": "{NQN}", "listen_address": {{"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"}}}}}}]}}
]}}"#
        ),
    )
    .unwrap();
    let p = path.display().to_string();
    let (mut child, addr, mut out) = common::start_target(&["-c", &p, "-m", "0x1"], Stdio::null());
    let b = banner(&mut out);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&path);
    assert_eq!(
        b[..5],
        [
            format!("pollux target: subsystem {NQN}"),
            "pollux target:   namespace 1: Malloc0, 1 MiB (2048 x 512 B)".into(),
            "pollux target:   namespace 2: Null0, 1 GiB (262144 x 4096 B)".into(),
            format!("pollux target:   listeners: {addr}"),
            "pollux target:   hosts: any".into(),
        ]
    );
    assert_ne!(common::port_of(&addr), 0);
}

/// A port already taken is a refusal that says what to do (before:
/// "listening on 127.0.0.1:P: Address already in use (os error 98)").
#[test]
fn a_port_in_use_is_refused_with_what_to_do() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (code, _, err) = common::pollux(&["target", "--ram", "1MiB", "--listen", &addr]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot listen on {addr}: address already in use (another target running? choose another --listen port)"
        )),
        "{err}"
    );
}

/// NQNs are checked where they are given ("nqn." and at most 223
/// bytes), naming the option or key; a transport-ID key given twice is
/// refused naming it.
#[test]
fn names_are_checked_where_given() {
    let long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(204));
    for (args, name, why) in [
        (
            vec!["target", "--ram", "1MiB", "--nqn", "cnode1"],
            "--nqn",
            "nqn.",
        ),
        (
            vec!["target", "--ram", "1MiB", "--host", "myhost"],
            "--host",
            "nqn.",
        ),
        (
            vec!["target", "--ram", "1MiB", "--nqn", &long],
            "--nqn",
            "224",
        ),
        (
            vec![
                "perf",
                "-r",
                "trtype:tcp traddr:127.0.0.1 subnqn:cnode1",
                "-t",
                "1",
            ],
            "subnqn",
            "nqn.",
        ),
        (
            vec![
                "perf",
                "-r",
                "trtype:tcp traddr:127.0.0.1 subnqn:nqn.a:b hostnqn:me",
                "-t",
                "1",
            ],
            "hostnqn",
            "nqn.",
        ),
        (
            vec!["discover", "trtype:tcp traddr:127.0.0.1 hostnqn:me"],
            "hostnqn",
            "nqn.",
        ),
        (
            vec![
                "perf",
                "-r",
                "trtype:tcp traddr:127.0.0.1 traddr:127.0.0.2 subnqn:nqn.a:b",
                "-t",
                "1",
            ],
            "key 'traddr' given twice",
            "traddr:127.0.0.2",
        ),
    ] {
        let (code, _, err) = common::pollux(&args);
        assert_ne!(code, 0, "{args:?} accepted: {err}");
        assert!(
            err.contains(name) && err.contains(why),
            "{args:?} must name {name} and say {why}: {err}"
        );
    }
}
