//! The C example (examples/hello.c), built with `cc` against
//! include/pollux.h and linked with libpollux.so and with libpollux.a,
//! run over the emulated controller (RAM backend) and over NVMe/TCP to a
//! `pollux target --ram` this test starts: every run must verify its
//! data ("hello: verified N bytes"), two threads sharing one controller
//! included.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// target/<profile>/, where cargo put libpollux and the pollux binary.
fn out_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/c_example-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// hello.c linked with the shared library and with the static one, built
/// once for all tests (two tests building one file at once would race).
fn programs() -> &'static [PathBuf; 2] {
    static P: std::sync::OnceLock<[PathBuf; 2]> = std::sync::OnceLock::new();
    P.get_or_init(|| [build(true), build(false)])
}

/// Builds hello.c linked with the shared or the static library.
fn build(shared: bool) -> PathBuf {
    let dir = out_dir();
    let lib = dir.join(if shared {
        "libpollux.so"
    } else {
        "libpollux.a"
    });
    assert!(
        lib.exists(),
        "{} not built: cargo build -p pollux-capi first (cargo test builds the library only for its harness; scripts/test.sh does both)",
        lib.display()
    );
    let exe = dir.join(if shared {
        "hello-shared"
    } else {
        "hello-static"
    });
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(manifest().join("examples/hello.c"))
        .arg("-I")
        .arg(manifest().join("include"));
    if shared {
        cc.arg("-L").arg(&dir).args(["-lpollux", "-lpthread"]);
        cc.arg(format!("-Wl,-rpath,{}", dir.display()));
    } else {
        cc.arg(&lib).args(["-lpthread", "-ldl", "-lm"]);
    }
    let out = cc.output().expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `exe trid`, killed after a minute; asserts it verified its data.
fn run(exe: &Path, trid: &str) {
    let mut child = Command::new(exe)
        .arg(trid)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hello");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{} {trid:?} hung: killed", exe.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("hello's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("hello: verified 20480 bytes"),
        "{} {trid:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        exe.display(),
        out.status
    );
}

/// `pollux target --ram 16MiB` on a free port: the child (killed on drop)
/// and its address.
struct Target(Child, String);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_target() -> Target {
    let bin = out_dir().join("pollux");
    assert!(
        bin.exists(),
        "{} not built: cargo build -p pollux-cli (cargo test --workspace builds it)",
        bin.display()
    );
    // Its own JSON-RPC socket: targets of concurrent tests must not meet
    // on the default one.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sock = std::env::temp_dir().join(format!("pollux-capi-{}-{n}.sock", std::process::id()));
    let mut child = Command::new(bin)
        .args(["target", "--ram", "16MiB", "--listen", "127.0.0.1:0", "-r"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run pollux target");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("pollux target's first line");
    let addr = line
        .trim()
        .strip_prefix("pollux target: listening on ")
        .unwrap_or_else(|| panic!("pollux target's first line: {line:?}"))
        .to_string();
    Target(child, addr)
}

#[test]
fn hello_over_the_emulated_controller_shared_and_static() {
    for exe in programs() {
        run(exe, "trtype:soft backend:ram size:16MiB");
    }
}

#[test]
fn hello_over_tcp_to_pollux_target() {
    let t = start_target();
    let (ip, port) = t.1.rsplit_once(':').expect("IP:PORT");
    let trid = format!("trtype:tcp traddr:{ip} trsvcid:{port} subnqn:nqn.2016-06.io.pollux:cnode1");
    for exe in programs() {
        run(exe, &trid);
    }
}
