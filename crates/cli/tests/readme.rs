//! The README's examples, run as written: every command line of its `sh`
//! blocks, through `sh -c` with the `pollux` under test first in `PATH`,
//! in a directory holding the README's JSON example as `bdev.json`. A
//! command that only a Linux host, a real PCIe device or the whole test
//! suite can run is named here with the reason it is not run; a README
//! command this test does not know fails it, so a new example cannot go
//! untested. The `text` blocks of the JSON-RPC, C library and fio
//! sections are run by the tests that own them instead: `rpc.rs` (SPDK's
//! client on an empty target), `crates/capi/tests/c_example.rs` and
//! `crates/capi/fio/test.sh`.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How this test treats one README command.
#[derive(Debug, PartialEq)]
enum How {
    /// Runs to completion and must exit 0.
    Run,
    /// A server (`pollux target`): started, must print "listening on",
    /// serves the rest of its block, then gets SIGINT and must exit 0.
    Serve,
    /// Not run here, for this reason.
    Skip(&'static str),
}

fn how(cmd: &str) -> How {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["scripts/test.sh", ..] => How::Skip("the whole test suite, this test among it"),
        ["nvme", ..] => How::Skip("Linux's NVMe/TCP host: the guest suite runs nvme-cli against pollux target"),
        ["pollux", "setup", "list", ..] => How::Run,
        ["pollux", "setup", ..] => How::Skip("rebinds or reserves this machine's devices: setup's own tests run it on a fake sysfs and the guest suite on QEMU's controller"),
        ["pollux", "target", ..] => How::Serve,
        ["pollux", ..] | ["cargo", "run", "--release", "-p", "pollux-cli", "--", ..] => How::Run,
        _ => panic!("README command this test does not know: {cmd:?}; say how to run it in crates/cli/tests/readme.rs"),
    }
}

/// The README's `sh` blocks, each a list of command lines (comments and
/// blank lines dropped).
fn sh_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in readme.lines() {
        let t = line.trim();
        match (&mut cur, t) {
            (None, "```sh") => cur = Some(Vec::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                cur = None;
            }
            (Some(b), _) => {
                let cmd = t.split_once("  #").map_or(t, |(c, _)| c).trim();
                if !cmd.is_empty() && !cmd.starts_with('#') {
                    b.push(cmd.to_string());
                }
            }
            (None, _) => {}
        }
    }
    assert!(cur.is_none(), "README: an sh block is not closed");
    blocks
}

/// The README's first `json` block: the example `bdev.json`.
fn json_example(readme: &str) -> String {
    let (_, rest) = readme.split_once("```json\n").expect("a json block");
    let (json, _) = rest.split_once("```").expect("its end");
    json.to_string()
}

fn shell(cmd: &str, dir: &Path, path: &str) -> Command {
    // The README's first command builds and runs the release binary: the
    // test runs the binary under test with the same arguments instead.
    let cmd = cmd.replacen("cargo run --release -p pollux-cli -- ", "pollux ", 1);
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null());
    c
}

fn wait(mut child: Child, cmd: &str, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("README command {cmd:?} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(cmd: &str, dir: &Path, path: &str) {
    let child = shell(cmd, dir, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    let out = child.wait_with_output().expect("output");
    assert!(
        out.status.success(),
        "README command {cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_readmes_examples_run_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let dir = std::env::temp_dir().join(format!("pollux-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("bdev.json"), json_example(&readme)).expect("bdev.json");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pollux"));
    // `pollux` in the README is this binary, whatever its file name.
    let bindir = dir.join("bin");
    std::fs::create_dir_all(&bindir).expect("bin dir");
    // A wrapper: each target / bdevperf the README starts gets its own
    // JSON-RPC socket (tests run side by side; README commands use the
    // default one).
    let link = bindir.join("pollux");
    let _ = std::fs::remove_file(&link);
    let wrapper = format!(
        r#"#!/bin/sh
case "$1" in
target|bdevperf)
    case " $* " in
    *" -r "*|*" --rpc-socket"*) ;;
    *) sub=$1; shift; exec '{bin}' "$sub" -r '{dir}/rpc-'$$.sock "$@" ;;
    esac ;;
esac
exec '{bin}' "$@"
"#,
        bin = bin.display(),
        dir = dir.display()
    );
    std::fs::write(&link, wrapper).expect("pollux wrapper");
    std::fs::set_permissions(&link, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod pollux wrapper");
    let path = format!(
        "{}:{}",
        bindir.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let (mut ran, mut skipped) = (0, Vec::new());
    for block in sh_blocks(&readme) {
        let mut server: Option<(Child, String)> = None;
        for cmd in &block {
            match how(cmd) {
                How::Run => {
                    run(cmd, &dir, &path);
                    ran += 1;
                }
                How::Serve => {
                    assert!(server.is_none(), "two servers in one README block");
                    // `exec`: the pid that gets SIGINT is the target's.
                    let mut child = shell(&format!("exec {cmd}"), &dir, &path)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::inherit())
                        .spawn()
                        .expect("sh");
                    let listening = wait_listening(&mut child, LISTEN_TIMEOUT);
                    if let Err(e) = listening {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("README command {cmd:?}: {e}");
                    }
                    server = Some((child, cmd.clone()));
                    ran += 1;
                }
                How::Skip(why) => skipped.push(format!("{cmd}: {why}")),
            }
        }
        if let Some((child, cmd)) = server {
            let sent = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(sent.success(), "SIGINT to {cmd:?}");
            let st = wait(child, &cmd, Duration::from_secs(30));
            assert!(st.success(), "README command {cmd:?} after SIGINT: {st}");
        }
    }
    eprintln!("README: {ran} commands run; not run here:");
    for s in &skipped {
        eprintln!("  {s}");
    }
    assert!(ran >= 5, "only {ran} README commands ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// How long a README server may take to print "listening on".
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until `child` prints "listening on" on its stdout, at most
/// `limit`: an error when it ends its output or the time is up (a server
/// that never listens fails the test instead of hanging it). Its stdout is
/// drained afterwards so it never blocks on the pipe.
fn wait_listening(child: &mut Child, limit: Duration) -> Result<(), String> {
    let out = child.stdout.take().ok_or("no stdout pipe")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = BufReader::new(out);
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
            line.clear();
        }
    });
    match rx.recv_timeout(limit) {
        Ok(()) => Ok(()),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(format!("did not print \"listening on\" within {limit:?}"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err("ended its output without printing \"listening on\"".into())
        }
    }
}

#[test]
fn a_server_that_never_listens_fails_instead_of_hanging() {
    let mut quiet = Command::new("sh")
        .args(["-c", "exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let t0 = Instant::now();
    let e =
        wait_listening(&mut quiet, Duration::from_millis(300)).expect_err("sleep never listens");
    assert!(e.contains("within"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "waited {:?}",
        t0.elapsed()
    );
    let _ = quiet.kill();
    let _ = quiet.wait();

    let mut ends = Command::new("sh")
        .args(["-c", "echo starting"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let e = wait_listening(&mut ends, Duration::from_secs(20)).expect_err("no listening line");
    assert!(e.contains("ended"), "{e}");
    let _ = ends.wait();

    let mut ok = Command::new("sh")
        .args([
            "-c",
            "echo 'pollux target: listening on 127.0.0.1:1'; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    wait_listening(&mut ok, Duration::from_secs(20)).expect("it listens");
    let _ = ok.kill();
    let _ = ok.wait();
}
