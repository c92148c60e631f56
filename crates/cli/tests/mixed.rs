//! NVMe bdevs of different transports in one process: `pollux bdevperf`
//! and `pollux target` with an emulated controller (PCIe over the
//! emulator's platform) and an NVMe/TCP controller side by side, the
//! data verified. Before, one run refused the second transport ("cannot
//! be mixed").
mod common;

use std::process::{Child, Stdio};

use serde_json::Value;

const BACK: &str = "nqn.2024-01.io.pollux:mixed-back";
const FRONT: &str = "nqn.2024-01.io.pollux:mixed-front";

/// A `pollux target` serving a RAM namespace as `BACK`; killed on drop.
struct Served {
    child: Child,
    port: u16,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        let (child, addr, _) = common::start_target(args, Stdio::null());
        let port = common::port_of(&addr);
        Served { child, port }
    }

    fn ram() -> Served {
        Served::start(&[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "64MiB",
            "--nqn",
            BACK,
            "-m",
            "0x1",
        ])
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json(out: &str, err: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}\nstderr: {err}"))
}

/// The first core this process may run on.
fn first_core() -> String {
    common::allowed_cores()[0].to_string()
}

/// bdevperf with an emulated NVMe bdev and a TCP NVMe bdev (a `pollux
/// target` started here) at once: every unit written, read back and
/// compared (`-w verify`), then a verified random mix, on both.
#[test]
fn bdevperf_runs_an_emulated_and_a_tcp_nvme_bdev_at_once() {
    let t = Served::ram();
    let tcp = format!(
        "trtype:tcp traddr:127.0.0.1 trsvcid:{} subnqn:{BACK}",
        t.port
    );
    let core = first_core();
    for (w, extra) in [("verify", &[][..]), ("randrw", &["--verify"][..])] {
        let mut args = vec![
            "bdevperf",
            "--json",
            "--nvme",
            "trtype:soft backend:ram size:8MiB",
            "--nvme",
            &tcp,
            "-w",
            w,
            "-o",
            "8k",
            "-q",
            "16",
            "-t",
            "0",
            "--io-count",
            "4000",
            "-m",
            &core,
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = common::pollux(&args);
        assert_eq!(code, 0, "-w {w}: {out}\n{err}");
        let v = json(&out, &err);
        assert_eq!(v["total"]["ios"], 4000, "-w {w}: {v}");
        assert_eq!(v["total"]["errors"], 0, "-w {w}: {}", v["errors"]);
        let bdevs = v["bdevs"].as_array().expect("bdevs");
        let names: Vec<_> = bdevs.iter().map(|b| b["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Nvme0n1", "Nvme1n1"], "-w {w}: {v}");
        for b in bdevs {
            assert_eq!(b["backend"], "nvme", "{v}");
            assert!(b["reads"].as_u64() > Some(0), "-w {w}: {b}");
            assert!(b["writes"].as_u64() > Some(0), "-w {w}: {b}");
        }
    }
}

/// `pollux target` exporting an emulated controller's namespace and a TCP
/// controller's (another `pollux target`) in one subsystem, from `-c`;
/// pollux perf verifies randrw on both through it.
#[test]
fn target_exports_an_emulated_and_a_tcp_nvme_namespace() {
    let back = Served::ram();
    let dir = std::env::temp_dir().join(format!("pollux-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.json");
    let cfg = format!(
        r#"{{"subsystems": [
  {{"subsystem": "bdev", "config": [
    {{"method": "bdev_nvme_attach_controller", "params": {{"name": "Soft0", "trtype": "soft", "backend": "ram", "size": "16MiB"}}}},
    {{"method": "bdev_nvme_attach_controller", "params": {{"name": "Tcp0", "trtype": "tcp", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": "{BACK}"}}}}]}},
  {{"subsystem": "nvmf", "config": [
    {{"method": "nvmf_create_subsystem", "params": {{"nqn": "{FRONT}", "allow_any_host": true}}}},
    {{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{FRONT}", "namespace": {{"bdev_name": "Soft0n1"}}}}}},
    {{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{FRONT}", "namespace": {{"bdev_name": "Tcp0n1"}}}}}},
    {{"method": "nvmf_subsystem_add_listener", "params": {{"nqn": "{FRONT}", "listen_address": {{"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"}}}}}}]}}
]}}"#,
        port = back.port
    );
    std::fs::write(&path, cfg).unwrap();
    let p = path.display().to_string();
    let front = Served::start(&["-c", &p, "-m", "0x1"]);
    let _ = std::fs::remove_dir_all(&dir);
    let r = format!(
        "trtype:tcp traddr:127.0.0.1 trsvcid:{} subnqn:{FRONT}",
        front.port
    );
    for io in ["4096", "64k"] {
        let (code, out, err) = common::pollux(&[
            "perf",
            "-r",
            &r,
            "-w",
            "randrw",
            "-M",
            "50",
            "-q",
            "8",
            "-o",
            io,
            "--verify",
            "-t",
            "0",
            "--io-count",
            "2000",
            "--json",
            "-c",
            "0",
        ]);
        assert_eq!(code, 0, "-o {io}: {out}\n{err}");
        let v = json(&out, &err);
        assert_eq!(v["total"]["errors"], 0, "-o {io}: {v}");
        let jobs = v["devices"].as_array().expect("devices");
        assert_eq!(jobs.len(), 2, "two namespaces: {v}");
        for j in jobs {
            assert!(j["ios"].as_u64() > Some(0), "-o {io}: {v}");
            assert_eq!(j["errors"], 0, "-o {io}: {v}");
        }
    }
    drop(front);
    drop(back);
}
