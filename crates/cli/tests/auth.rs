//! DH-HMAC-CHAP end to end with both ends pollux: `pollux perf --verify`
//! with `dhchap_key:`/`dhchap_ctrlr_key:` against `pollux target --host
//! NQN --dhchap-key [--dhchap-ctrl-key]`, one-way and bidirectional (with
//! a restricted digest and group), and each way it must be refused: a
//! wrong host secret, a wrong controller secret, no secret at all.
//! (Against Linux: tests/guest/auth-{host,target}.sh; against SPDK:
//! tests/spdk.rs.)
mod common;

use common::{CTRL_SECRET, HOST_SECRET, WRONG_SECRET};

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

const NQN: &str = "nqn.2026-11.io.pollux:auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0b8c2a61-7d3e-4f0a-9c55-2e6b1f4d8a70";

/// A `pollux target` killed and reaped on drop.
struct Target(Child, u16, PathBuf);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Target {
    fn start(extra: &[&str], log: &Path) -> Target {
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "16MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
        ];
        args.extend_from_slice(extra);
        let f = std::fs::File::create(log).expect("target log");
        let (child, addr, _) = common::start_target(&args, Stdio::from(f));
        Target(child, common::port_of(&addr), log.to_path_buf())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.2).unwrap_or_default()
    }
}

/// `pollux perf --verify` (randrw, 500 I/Os) with the transport-ID keys
/// `keys`: exit code, stdout, stderr.
fn perf(port: u16, keys: &str) -> (i32, String, String) {
    let r =
        format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} hostnqn:{HOST} {keys}");
    common::pollux(&[
        "perf",
        "-r",
        &r,
        "-w",
        "randrw",
        "-M",
        "50",
        "-o",
        "4096",
        "-q",
        "8",
        "--verify",
        "-t",
        "0",
        "--io-count",
        "500",
        "--json",
        "-c",
        "0",
    ])
}

fn assert_ran(r: (i32, String, String), what: &str) {
    let (code, out, err) = r;
    assert_eq!(code, 0, "{what}: {out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("perf --json");
    assert_eq!(v["total"]["ios"], 500, "{what}: {out}");
    assert_eq!(v["total"]["errors"], 0, "{what}: {out}");
}

fn assert_refused(r: (i32, String, String), what: &str, says: &str) {
    let (code, out, err) = r;
    assert_ne!(code, 0, "{what} got in: {out}\n{err}");
    assert!(err.contains(says), "{what}: no {says:?} in:\n{err}");
    for s in [HOST_SECRET, CTRL_SECRET, WRONG_SECRET] {
        let key = &s[10..30];
        assert!(!err.contains(key), "{what}: a secret in the error:\n{err}");
    }
}

#[test]
fn pollux_host_authenticates_to_pollux_target() {
    let keys = common::Keys::new("oneway");
    let s = |n: &str| keys.path(n).display().to_string();
    let (hk, ck, wk) = (s("host.key"), s("ctrl.key"), s("wrong.key"));
    let log = keys.path("target.log");

    // One-way: the host proves itself.
    let t = Target::start(&["--host", HOST, "--dhchap-key", &hk], &log);
    assert_ran(perf(t.1, &format!("dhchap_key:{hk}")), "one-way");
    assert_refused(
        perf(t.1, &format!("dhchap_key:{wk}")),
        "a wrong host secret",
        "authentication",
    );
    assert_refused(perf(t.1, ""), "no host secret", "dhchap_key");
    let warned = t.log();
    assert!(
        warned
            .lines()
            .any(|l| l.contains("WARN") && l.contains(HOST) && l.contains("127.0.0.1:")),
        "the target did not warn naming the host and its address:\n{warned}"
    );
    for s in [HOST_SECRET, WRONG_SECRET] {
        assert!(
            !warned.contains(&s[10..30]),
            "a secret in the target's log:\n{warned}"
        );
    }
    drop(t);

    // Bidirectional, one digest and one group offered by the target.
    let t = Target::start(
        &[
            "--host",
            HOST,
            "--dhchap-key",
            &hk,
            "--dhchap-ctrl-key",
            &ck,
            "--dhchap-digests",
            "sha384",
            "--dhchap-dhgroups",
            "ffdhe3072",
        ],
        &log,
    );
    assert_ran(
        perf(t.1, &format!("dhchap_key:{hk} dhchap_ctrlr_key:{ck}")),
        "bidirectional, sha384/ffdhe3072",
    );
    assert_refused(
        perf(t.1, &format!("dhchap_key:{hk} dhchap_ctrlr_key:{wk}")),
        "a controller that does not know the controller secret",
        "authentication",
    );
    assert_refused(
        perf(
            t.1,
            &format!("dhchap_key:{hk} dhchap_ctrlr_key:{ck} dhchap_dhgroups:ffdhe2048"),
        ),
        "no DH group in common",
        "authentication",
    );
}
