//! SPDK v25.09 as a peer: SPDK's host (spdk_nvme_perf, spdk_nvme_identify)
//! with its default transport ID against `pollux target`, and `pollux perf
//! --verify` against SPDK's nvmf_tgt, without and with header and data
//! digests.
//!
//! Runs when SPDK is built (`../shared/spdk/build.sh`) in `SPDK_DIR`
//! (default /tmp/spdk); otherwise each test says so and returns. SPDK
//! needs 2 MiB hugepages (hugetlbfs at /dev/hugepages): as root, the tests
//! raise `vm.nr_hugepages` to 1024 when fewer are free. One SPDK process at
//! a time on the machine: the tests hold `flock /tmp/spdk.lock` (as the
//! shared scripts do) and kill what they start, even when they fail.
mod common;

use std::fs::File;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.pollux:spdk-peer";

/// The tests of this file, one at a time (each also holds the machine's
/// SPDK lock).
static SERIAL: Mutex<()> = Mutex::new(());

/// SPDK's directory if its binaries are built; None (said on stderr)
/// otherwise.
fn spdk() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var("SPDK_DIR").unwrap_or_else(|_| "/tmp/spdk".into()));
    let need = [
        "build/bin/nvmf_tgt",
        "build/bin/spdk_nvme_perf",
        "build/bin/spdk_nvme_identify",
        "scripts/rpc.py",
    ];
    match need.iter().find(|p| !dir.join(p).exists()) {
        None => Some(dir),
        Some(p) => {
            eprintln!(
                "SPDK not built ({} missing): skipping; build it with ../shared/spdk/build.sh (SPDK_DIR, default /tmp/spdk)",
                dir.join(p).display()
            );
            None
        }
    }
}

/// `/tmp/spdk.lock`, held (flock) while the guard lives.
struct SpdkLock(File);

impl SpdkLock {
    fn take() -> SpdkLock {
        let f = File::create("/tmp/spdk.lock").expect("open /tmp/spdk.lock");
        // SAFETY: flock(2) on a descriptor this File owns.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock /tmp/spdk.lock");
        SpdkLock(f)
    }
}

impl Drop for SpdkLock {
    fn drop(&mut self) {
        // SAFETY: flock(2) on a descriptor this File owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn free_hugepages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("HugePages_Free:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Hugepages for SPDK (512 free 2 MiB pages at least); false (said on
/// stderr) when they cannot be had.
fn hugepages() -> bool {
    if free_hugepages() < 512 {
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", "1024");
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
        })
        .unwrap_or(false);
    if !mounted {
        let _ = std::fs::create_dir_all("/dev/hugepages");
        let _ = Command::new("mount")
            .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
            .status();
    }
    let free = free_hugepages();
    if free < 512 {
        eprintln!("only {free} free 2 MiB hugepages (SPDK needs 512): skipping; as root: echo 1024 > /proc/sys/vm/nr_hugepages");
        return false;
    }
    true
}

/// Everything a test needs before it starts SPDK: SPDK built, hugepages,
/// both locks.
fn setup() -> Option<(PathBuf, SpdkLock, std::sync::MutexGuard<'static, ()>)> {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = spdk()?;
    let lock = SpdkLock::take();
    if !hugepages() {
        return None;
    }
    Some((dir, lock, serial))
}

/// A child process killed (SIGKILL) and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `pollux target` on a free loopback port with a RAM namespace, any host.
fn pollux_target() -> (Killed, u16) {
    pollux_target_with(&[], Stdio::null())
}

/// `pollux target` as [`pollux_target`], allowing only host `host`, its
/// stderr (warnings) written to `log`.
fn pollux_target_allowing(host: &str, log: &Path) -> (Killed, u16) {
    let log = File::create(log).expect("target log");
    pollux_target_with(&["--host", host], log.into())
}

fn pollux_target_with(extra: &[&str], stderr: Stdio) -> (Killed, u16) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--ram",
        "64MiB",
        "--nqn",
        NQN,
        "-m",
        "0x1",
    ];
    args.extend_from_slice(extra);
    let (child, addr, _) = common::start_target(&args, stderr);
    (Killed(child), common::port_of(&addr))
}

/// SPDK's TCP transport ID of a loopback subsystem, as SPDK's tools take
/// it: without `hostnqn:`, so SPDK's host sends an empty host NQN.
fn spdk_trid(port: u16) -> String {
    format!("trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}")
}

/// Runs an SPDK tool to its end (killed after [`common::HANG`]): exit
/// code and stdout + stderr.
fn run_spdk(bin: &Path, args: &[&str]) -> (i32, String) {
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let (code, out, err) = common::finish(child, args, None);
    (code, format!("{out}{err}"))
}

/// SPDK perf's "Total" IOPS.
fn total_iops(out: &str) -> f64 {
    out.lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .and_then(|l| l.split(':').nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Total line in SPDK perf's output:\n{out}"))
}

/// SPDK's host with its default options (no host NQN) against `pollux
/// target`, 4 KiB and 128 KiB random reads and writes at QD 128, without
/// and with header and data digests (`-H -I`). Before, its Connect
/// failed ("sct 1, sc 130": an empty host NQN refused).
#[test]
fn spdk_perf_against_pollux_target() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    let (_t, port) = pollux_target();
    let trid = spdk_trid(port);
    let perf = dir.join("build/bin/spdk_nvme_perf");
    for (io, digests) in [("4096", false), ("131072", false), ("4096", true)] {
        let mut args = vec![
            "-c", "0x2", "-r", &trid, "-q", "128", "-o", io, "-w", "randrw", "-M", "50", "-t", "2",
        ];
        if digests {
            args.extend(["-H", "-I"]);
        }
        let (code, out) = run_spdk(&perf, &args);
        assert_eq!(code, 0, "spdk_nvme_perf {args:?}:\n{out}");
        assert!(total_iops(&out) > 0.0, "{args:?}:\n{out}");
        assert!(!out.contains("*ERROR*"), "{args:?}:\n{out}");
    }
}

/// SPDK's host with its default options (an empty host NQN) against a
/// subsystem with an allow list: refused with Connect Invalid Host (SPDK
/// prints "sct 1, sc 132"), and the target warns naming the peer; with
/// the listed host NQN in its transport ID, SPDK's host gets in.
#[test]
fn spdk_perf_with_an_empty_host_nqn_is_refused_by_an_allow_list() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:12a79949-9a45-41fa-85c6-a7381d014ef3";
    let log = std::env::temp_dir().join(format!("pollux-spdk-allow-{}.log", std::process::id()));
    let (t, port) = pollux_target_allowing(HOST, &log);
    let perf = dir.join("build/bin/spdk_nvme_perf");
    let trid = spdk_trid(port);
    let args = [
        "-c", "0x2", "-r", &trid, "-q", "8", "-o", "4096", "-w", "randread", "-t", "1",
    ];
    // (SPDK's perf exits 0 when no controller attaches.)
    let (_, out) = run_spdk(&perf, &args);
    assert!(
        out.contains("sct 1, sc 132") && out.contains("No valid NVMe controllers"),
        "SPDK's host without a host NQN was not refused with Connect Invalid Host:\n{out}"
    );
    let with_host = format!("{trid} hostnqn:{HOST}");
    let args = [
        "-c", "0x2", "-r", &with_host, "-q", "8", "-o", "4096", "-w", "randread", "-t", "1",
    ];
    let (code, out) = run_spdk(&perf, &args);
    assert_eq!(code, 0, "{out}");
    assert!(total_iops(&out) > 0.0, "{out}");
    drop(t);
    let warned = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        warned.lines().any(|l| l.contains("WARN")
            && l.contains("empty host NQN")
            && l.contains("peer=127.0.0.1:")),
        "no warning naming the peer:\n{warned}"
    );
}

/// spdk_nvme_identify against `pollux target`: every feature and log page
/// it asks for answered, the Commands Supported and Effects log included.
/// Before, "get_feature(0x02) failed" and "get_feature(0x05) failed".
#[test]
fn spdk_identify_against_pollux_target_finds_no_failure() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    let (_t, port) = pollux_target();
    let trid = spdk_trid(port);
    let (code, out) = run_spdk(&dir.join("build/bin/spdk_nvme_identify"), &["-r", &trid]);
    assert_eq!(code, 0, "{out}");
    let failed: Vec<&str> = out
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("failed"))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}\n{out}");
    assert!(out.contains("Commands Supported and Effects"), "{out}");
    assert!(out.contains("Power Management"), "{out}");
}

/// SPDK's nvmf_tgt over a Malloc bdev on a free loopback port, TCP
/// transport with its defaults (max_queue_depth 128, digests accepted).
struct NvmfTgt {
    _child: Killed,
    port: u16,
    sock: PathBuf,
}

/// A host allowed in with DH-HMAC-CHAP keys (files): SPDK's
/// `keyring_file_add_key` and `nvmf_subsystem_add_host --dhchap-key
/// [--dhchap-ctrlr-key]`, on a subsystem without "allow any host".
struct AuthHost<'a> {
    nqn: &'a str,
    key: &'a Path,
    ctrlr_key: Option<&'a Path>,
}

impl NvmfTgt {
    fn start(dir: &Path) -> NvmfTgt {
        NvmfTgt::start_with(dir, None)
    }

    fn start_with(dir: &Path, auth: Option<&AuthHost>) -> NvmfTgt {
        let sock = std::env::temp_dir().join(format!("pollux-spdk-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let child = Command::new(dir.join("build/bin/nvmf_tgt"))
            .args(["-m", "0x1", "-r"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nvmf_tgt");
        let child = Killed(child);
        let deadline = Instant::now() + common::HANG;
        while !sock.exists() {
            assert!(Instant::now() < deadline, "nvmf_tgt: no RPC socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let port_s = port.to_string();
        let rpc = |args: &[&str]| {
            let mut c = Command::new("/usr/bin/python3");
            c.arg(dir.join("scripts/rpc.py"))
                .arg("-s")
                .arg(&sock)
                .args(args);
            let out = c.output().expect("rpc.py");
            assert!(
                out.status.success(),
                "rpc.py {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        rpc(&["nvmf_create_transport", "-t", "TCP"]);
        rpc(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"]);
        let mut create = vec!["nvmf_create_subsystem", NQN, "-s", "SPDK00000000000001"];
        if auth.is_none() {
            create.push("-a");
        }
        rpc(&create);
        if let Some(a) = auth {
            let key = a.key.to_str().expect("key path");
            rpc(&["keyring_file_add_key", "key0", key]);
            let mut add = vec![
                "nvmf_subsystem_add_host",
                NQN,
                a.nqn,
                "--dhchap-key",
                "key0",
            ];
            if let Some(c) = a.ctrlr_key {
                rpc(&[
                    "keyring_file_add_key",
                    "ckey0",
                    c.to_str().expect("key path"),
                ]);
                add.extend(["--dhchap-ctrlr-key", "ckey0"]);
            }
            rpc(&add);
        }
        rpc(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
        rpc(&[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port_s,
            "-f",
            "ipv4",
        ]);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nvmf_tgt: not listening on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        NvmfTgt {
            _child: child,
            port,
            sock,
        }
    }
}

impl Drop for NvmfTgt {
    fn drop(&mut self) {
        // (The process itself is killed by `_child`'s drop, after this.)
        let _ = std::fs::remove_file(&self.sock);
        let mut lock = self.sock.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
    }
}

/// `pollux perf --verify` against SPDK's nvmf_tgt at perf's default depth
/// (-q 128 against queues of 128 entries: one command waits in software),
/// in-capsule (4 KiB) and R2T/C2HData (128 KiB) transfers, without and
/// with header and data digests: every read checked, zero errors.
#[test]
fn pollux_perf_verify_against_spdk_nvmf_tgt() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    let t = NvmfTgt::start(&dir);
    for (io, extra) in [
        ("4096", ""),
        ("128k", ""),
        ("4096", " hdgst:1 ddgst:1"),
        ("128k", " hdgst:1 ddgst:1"),
    ] {
        let r = format!(
            "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{} subnqn:{NQN}{extra}",
            t.port
        );
        let args = [
            "perf",
            "-r",
            &r,
            "-w",
            "randrw",
            "-M",
            "50",
            "-o",
            io,
            "--verify",
            "-t",
            "0",
            "--io-count",
            "3000",
            "--json",
            "-c",
            "1",
        ];
        let (code, out, err) = common::pollux(&args);
        assert_eq!(code, 0, "{args:?}: {out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("perf --json");
        assert_eq!(v["total"]["ios"], 3000, "{args:?}: {out}");
        assert_eq!(v["total"]["errors"], 0, "{args:?}: {out}");
    }
}

/// The host NQN of the authentication tests.
const AUTH_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6f3a1d2e-51c4-4b8e-9a57-0c2d8e4f7b19";

/// SPDK's host (spdk_nvme_perf `--dhchap-key`/`--dhchap-ctrlr-key`)
/// against `pollux target --host NQN --dhchap-key [--dhchap-ctrl-key]`:
/// one-way and bidirectional authentication succeed and I/O runs; a wrong
/// host secret, and a wrong controller secret on SPDK's side, attach no
/// controller.
#[test]
fn spdk_perf_authenticates_to_pollux_target() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    let keys = common::Keys::new("tgt");
    let (host_key, ctrl_key, wrong) = (
        keys.path("host.key"),
        keys.path("ctrl.key"),
        keys.path("wrong.key"),
    );
    let (hk, ck, wk) = (
        host_key.to_str().unwrap(),
        ctrl_key.to_str().unwrap(),
        wrong.to_str().unwrap(),
    );
    let perf = dir.join("build/bin/spdk_nvme_perf");
    for bidirectional in [false, true] {
        let mut extra = vec!["--host", AUTH_HOST, "--dhchap-key", hk];
        if bidirectional {
            extra.extend(["--dhchap-ctrl-key", ck]);
        }
        let (_t, port) = pollux_target_with(&extra, Stdio::null());
        let trid = format!("{} hostnqn:{AUTH_HOST}", spdk_trid(port));
        let run = |host: &str, ctrl: Option<&str>| {
            let mut args = vec![
                "-c",
                "0x2",
                "-r",
                &trid,
                "-q",
                "32",
                "-o",
                "4096",
                "-w",
                "randread",
                "-t",
                "1",
                "--dhchap-key",
                host,
            ];
            if let Some(c) = ctrl {
                args.extend(["--dhchap-ctrlr-key", c]);
            }
            let (code, out) = run_spdk(&perf, &args);
            (
                code,
                out,
                args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            )
        };
        let ctrl = bidirectional.then_some(ck);
        let (code, out, args) = run(hk, ctrl);
        assert_eq!(code, 0, "{args:?}:\n{out}");
        assert!(total_iops(&out) > 0.0, "{args:?}:\n{out}");
        let (_, out, args) = run(wk, ctrl);
        assert!(
            out.contains("No valid NVMe controllers"),
            "a wrong host secret got in: {args:?}:\n{out}"
        );
        if bidirectional {
            let (_, out, args) = run(hk, Some(wk));
            assert!(
                out.contains("No valid NVMe controllers"),
                "SPDK accepted a controller that does not know its controller secret: {args:?}:\n{out}"
            );
        }
    }
}

/// `pollux perf --verify` with `dhchap_key:`/`dhchap_ctrlr_key:` against
/// SPDK's nvmf_tgt with the host's keys in its keyring: one-way and
/// bidirectional authentication on the admin and I/O queues, zero errors;
/// a wrong host secret is refused by SPDK, and a controller that fails
/// bidirectional authentication (SPDK given another controller secret) is
/// refused by pollux; both exit non-zero naming authentication.
#[test]
fn pollux_perf_authenticates_to_spdk_nvmf_tgt() {
    let Some((dir, _lock, _serial)) = setup() else {
        return;
    };
    let keys = common::Keys::new("host");
    let (host_key, ctrl_key, wrong) = (
        keys.path("host.key"),
        keys.path("ctrl.key"),
        keys.path("wrong.key"),
    );
    for bidirectional in [false, true] {
        let t = NvmfTgt::start_with(
            &dir,
            Some(&AuthHost {
                nqn: AUTH_HOST,
                key: &host_key,
                ctrlr_key: bidirectional.then_some(ctrl_key.as_path()),
            }),
        );
        let perf = |key: &Path, ctrl: Option<&Path>| {
            let mut r = format!(
                "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{} subnqn:{NQN} hostnqn:{AUTH_HOST} dhchap_key:{}",
                t.port,
                key.display()
            );
            if let Some(c) = ctrl {
                r.push_str(&format!(" dhchap_ctrlr_key:{}", c.display()));
            }
            let args = [
                "perf",
                "-r",
                &r,
                "-w",
                "randrw",
                "-M",
                "50",
                "-o",
                "4096",
                "--verify",
                "-t",
                "0",
                "--io-count",
                "2000",
                "--json",
                "-c",
                "1",
            ];
            let (code, out, err) = common::pollux(&args);
            (code, out, err, r)
        };
        let ctrl = bidirectional.then_some(ctrl_key.as_path());
        let (code, out, err, r) = perf(&host_key, ctrl);
        assert_eq!(code, 0, "{r}: {out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("perf --json");
        assert_eq!(v["total"]["ios"], 2000, "{r}: {out}");
        assert_eq!(v["total"]["errors"], 0, "{r}: {out}");
        let (code, out, err, r) = perf(&wrong, ctrl);
        assert_ne!(code, 0, "a wrong host secret got in: {r}: {out}\n{err}");
        assert!(err.to_lowercase().contains("authenticat"), "{r}: {err}");
        if bidirectional {
            let (code, out, err, r) = perf(&host_key, Some(&wrong));
            assert_ne!(code, 0, "pollux accepted a controller that failed bidirectional authentication: {r}: {out}\n{err}");
            assert!(err.to_lowercase().contains("authenticat"), "{r}: {err}");
        }
    }
}
