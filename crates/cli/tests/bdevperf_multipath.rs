//! `pollux bdevperf` over a multipath NVMe bdev: two `pollux target`
//! processes export one file (io_uring) under one subsystem NQN; one is
//! killed and restarted during `--verify`, with no error. The paths are
//! given as `--multipath --nvme A --nvme B`.
mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.pollux:bdev-mp-test";

struct Target {
    child: Child,
    port: u16,
}

impl Target {
    fn start(file: &str, nqn: &str, port: u16) -> Target {
        let listen = format!("127.0.0.1:{port}");
        let args = [
            "--listen", &listen, "--uring", file, "--nqn", nqn, "-m", "0x1",
        ];
        let (child, addr, _out) = common::start_target(&args, Stdio::null());
        Target {
            child,
            port: common::port_of(&addr),
        }
    }

    fn trid(&self, nqn: &str) -> String {
        format!(
            "trtype:tcp traddr:127.0.0.1 trsvcid:{} subnqn:{nqn} reconnect_delay:1",
            self.port
        )
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn image(name: &str) -> String {
    let p = std::env::temp_dir().join(format!("pollux-bdev-mp-{}-{name}.img", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(16 << 20).unwrap();
    p.display().to_string()
}

fn json(out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\n{err}"))
}

#[test]
fn bdevperf_verify_over_two_paths_while_one_target_is_killed_and_restarted() {
    let file = image("kill");
    let a = Target::start(&file, NQN, 0);
    let b = Target::start(&file, NQN, 0);
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
        Target::start(&file2, NQN, port)
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
