//! Running the `pollux` binary in tests, as a user does.
#![allow(dead_code)]
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A run that has not exited by then is a hang: it is killed and the test
/// fails (instead of hanging CI).
pub const HANG: Duration = Duration::from_secs(60);

/// A fresh JSON-RPC socket path: each `pollux target` / `pollux bdevperf`
/// a test starts gets its own (they all default to
/// `/var/tmp/pollux.sock`, and a second one there is refused).
pub fn rpc_socket() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir()
        .join(format!(
            "pollux-test-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
        .display()
        .to_string()
}

/// `args` of a run, with `-r <fresh socket>` after `target` / `bdevperf`
/// unless the test gives `-r` itself.
pub fn with_rpc_socket(args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let serves = matches!(args.first(), Some(&"target") | Some(&"bdevperf"));
    let given = args
        .iter()
        .any(|a| *a == "-r" || a.starts_with("--rpc-socket"));
    if serves && !given {
        v.insert(1, "-r".into());
        v.insert(2, rpc_socket());
    }
    v
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pollux"))
        .args(with_rpc_socket(args))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pollux")
}

/// Waits for `child` (reading both pipes meanwhile, so a full pipe cannot
/// stall it); `after`'s function gets the child's pid once its time passed.
pub fn finish(
    mut child: Child,
    args: &[&str],
    after: Option<(Duration, &dyn Fn(u32))>,
) -> (i32, String, String) {
    let reader = |mut p: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = p.read_to_end(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let mut pending = after;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for pollux") {
            break st;
        }
        if let Some((d, f)) = pending {
            if start.elapsed() >= d {
                f(child.id());
                pending = None;
            }
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pollux {args:?} did not exit within {HANG:?}: killed (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

pub fn pollux(args: &[&str]) -> (i32, String, String) {
    finish(spawn(args), args, None)
}

/// Starts `pollux target` with `args` (its stderr to `stderr`) and waits
/// for its first line: the child, the address it listens on, and the rest
/// of its stdout.
pub fn start_target(
    args: &[&str],
    stderr: Stdio,
) -> (Child, String, std::io::BufReader<std::process::ChildStdout>) {
    let full: Vec<&str> = std::iter::once("target")
        .chain(args.iter().copied())
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollux"))
        .args(with_rpc_socket(&full))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("run pollux target");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)
        .expect("pollux target's first line");
    let addr = line
        .trim()
        .strip_prefix("pollux target: listening on ")
        .unwrap_or_else(|| panic!("pollux target's first line: {line:?}"))
        .to_string();
    (child, addr, out)
}

/// The port of `IP:PORT`.
pub fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// The CPUs this process may run on (sched_getaffinity), in order.
pub fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The latency keys of a JSON row or total (`-L`), smallest first.
pub const LATENCY_KEYS: [&str; 7] = [
    "min_lat_us",
    "p50_lat_us",
    "p90_lat_us",
    "p99_lat_us",
    "p99_9_lat_us",
    "p99_99_lat_us",
    "max_lat_us",
];

/// Whether `t` has every latency key, each above 0, in order.
pub fn latencies_in_order(t: &serde_json::Value) -> bool {
    LATENCY_KEYS
        .iter()
        .all(|k| t[k].as_f64().is_some_and(|x| x > 0.0))
        && LATENCY_KEYS
            .windows(2)
            .all(|k| t[k[0]].as_f64() <= t[k[1]].as_f64())
}

/// Test secrets in the DHHC-1 form `nvme gen-dhchap-key` writes (32 bytes,
/// untransformed); the third is given to neither side: the wrong one.
pub const HOST_SECRET: &str = "DHHC-1:00:StC3qVqxy/Gil2n5tE3USLshTqie1f/+tuuuDALzmEb8/b5T:";
pub const CTRL_SECRET: &str = "DHHC-1:00:WD0PoYZH6nGJODFeKUsbvKbN1xX0iJ2SyDv8848hUDutoxnQ:";
pub const WRONG_SECRET: &str = "DHHC-1:00:LEqzV5I3xkOxCV1MFP72U4Aa9LLUgBIDmSyh9/CfJ9lcDcp0:";

/// Key files host.key, ctrl.key and wrong.key (mode 0600, as SPDK's
/// keyring and pollux require) in a fresh directory, removed on drop.
pub struct Keys(std::path::PathBuf);

impl Keys {
    pub fn new(tag: &str) -> Keys {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("pollux-keys-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("key dir");
        for (name, text) in [
            ("host.key", HOST_SECRET),
            ("ctrl.key", CTRL_SECRET),
            ("wrong.key", WRONG_SECRET),
        ] {
            let p = d.join(name);
            std::fs::write(&p, format!("{text}\n")).expect("key file");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        Keys(d)
    }

    /// A file of the directory.
    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `pollux target` exporting a file through io_uring (`--uring FILE`) on
/// a loopback port (0: any free one), killed and reaped on drop: one path
/// of the multipath tests.
pub struct FileTarget {
    pub child: Child,
    pub port: u16,
}

impl FileTarget {
    pub fn start(file: &str, nqn: &str, port: u16) -> FileTarget {
        let listen = format!("127.0.0.1:{port}");
        let args = [
            "--listen", &listen, "--uring", file, "--nqn", nqn, "-m", "0x1",
        ];
        let (child, addr, _out) = start_target(&args, Stdio::null());
        FileTarget {
            child,
            port: port_of(&addr),
        }
    }

    /// On a thread of its own: kills this target `after` from now, then
    /// serves `file` again on its port `after` later; the thread returns
    /// the new target.
    pub fn kill_and_restart(
        mut self,
        file: &str,
        nqn: &str,
        after: std::time::Duration,
    ) -> std::thread::JoinHandle<FileTarget> {
        let (file, nqn, port) = (file.to_string(), nqn.to_string(), self.port);
        std::thread::spawn(move || {
            std::thread::sleep(after);
            let _ = self.child.kill();
            let _ = self.child.wait();
            std::thread::sleep(after);
            FileTarget::start(&file, &nqn, port)
        })
    }

    /// Its transport ID for subsystem `nqn` (reconnecting every second).
    pub fn trid(&self, nqn: &str) -> String {
        format!(
            "trtype:tcp traddr:127.0.0.1 trsvcid:{} subnqn:{nqn} reconnect_delay:1",
            self.port
        )
    }
}

impl Drop for FileTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 16 MiB sparse file in the temporary directory, named after `name`.
pub fn image(name: &str) -> String {
    let p = std::env::temp_dir().join(format!("pollux-{}-{name}.img", std::process::id()));
    let f = std::fs::File::create(&p).expect("image file");
    f.set_len(16 << 20).expect("image size");
    p.display().to_string()
}

/// A running `pollux target` on socket `sock`; SIGINT and reaped on drop.
pub struct Target {
    pub child: Child,
    pub sock: String,
    /// Its stdout up to the JSON-RPC line.
    pub lines: Vec<String>,
}

impl Target {
    pub fn start(sock: &str, extra: &[&str]) -> Target {
        let core = allowed_cores()[0].to_string();
        let mut args = vec!["target", "-r", sock, "--cpumask", &core];
        let mask;
        if core != "0" {
            mask = format!("[{core}]");
            args[4] = &mask;
        }
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_pollux"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run pollux target");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if out.read_line(&mut line).expect("read") == 0 {
                let _ = child.wait();
                panic!("pollux target {args:?} exited before serving JSON-RPC");
            }
            let done = line.contains("JSON-RPC on");
            lines.push(line.trim().to_string());
            if done {
                break;
            }
        }
        // Drain the rest so the target never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        Target {
            child,
            sock: sock.to_string(),
            lines,
        }
    }

    /// SIGINT; the exit code.
    pub fn stop(&mut self) -> i32 {
        // SAFETY: kill(2) on the child we spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        for _ in 0..500 {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code().unwrap_or(-1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("pollux target did not stop on SIGINT");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.stop();
        }
    }
}

/// One request over a raw socket, as SPDK's client frames it.
pub fn call(sock: &str, method: &str, params: Value) -> Value {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let req = json!({"jsonrpc": "2.0", "method": method, "id": 1, "params": params});
    s.write_all(serde_json::to_string_pretty(&req).unwrap().as_bytes())
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).expect("read the response");
        assert!(
            n > 0,
            "closed before a response: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        if let Some(Ok(v)) = serde_json::Deserializer::from_slice(&buf)
            .into_iter::<Value>()
            .next()
        {
            return v;
        }
    }
}
