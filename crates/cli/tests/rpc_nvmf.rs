//! `pollux target`'s `nvmf_*` JSON-RPC methods over its Unix socket (a
//! tiny JSON-RPC client here, framed as SPDK's `rpc.py`): a subsystem
//! created, given a listener and a host, listed with a host connected,
//! the host removed and the subsystem deleted, while the target's
//! first subsystem keeps serving; SPDK's error codes.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use pollux_spec::fabrics::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use pollux_spec::tcp::{CapsuleCmd, CapsuleResp, Digests, IcReq, IcResp};
use serde_json::{json, Value};
use zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.pollux:rpc-first";
const LIVE: &str = "nqn.2016-06.io.spdk:cnode1";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000003";

/// A JSON-RPC 2.0 client as SPDK's: one request object written, one
/// response object read back by incremental decoding.
struct Rpc {
    s: UnixStream,
    id: u64,
}

impl Rpc {
    fn connect(path: &Path) -> Rpc {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            match UnixStream::connect(path) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    return Rpc { s, id: 0 };
                }
                Err(e) if Instant::now() < end => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("RPC socket {}: {e}", path.display()),
            }
        }
    }

    /// The result, or the error object.
    fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.id += 1;
        let req = json!({"jsonrpc": "2.0", "method": method, "id": self.id, "params": params});
        self.s.write_all(req.to_string().as_bytes()).unwrap();
        let mut de = serde_json::Deserializer::from_reader(&mut self.s).into_iter::<Value>();
        let resp = de.next().expect("a response").expect("valid JSON");
        assert_eq!(resp["id"], self.id, "{resp}");
        match resp.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(resp["result"].clone()),
        }
    }
}

/// Admin Connect of `host` to `sub` at `addr`: its status (the
/// connection is kept open while `keep` holds it).
fn admin_connect(addr: &str, sub: &str, host: &str) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(IcReq::new(0, Digests::NONE, 0).as_bytes())
        .unwrap();
    let mut b = [0u8; 128];
    s.read_exact(&mut b).unwrap();
    IcResp::read_from_bytes(&b).unwrap().check().unwrap();
    let c = ConnectCmd::new(0, 31, 0, 0);
    let d = ConnectData::new([1; 16], CNTLID_DYNAMIC, sub, host).unwrap();
    let (h, l) = CapsuleCmd::new(&c.to_sqe(), 1024, Digests::NONE, 0).unwrap();
    let mut pdu = vec![0u8; l.plen as usize];
    let n = pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut pdu).unwrap();
    pdu[n..].copy_from_slice(d.as_bytes());
    s.write_all(&pdu).unwrap();
    let mut r = [0u8; 24];
    s.read_exact(&mut r).unwrap();
    let st = CapsuleResp::read_from_bytes(&r).unwrap().cqe.status();
    (s, st.0)
}

#[test]
fn nvmf_methods_configure_a_running_target() {
    let sock_s = common::rpc_socket();
    let sock = PathBuf::from(&sock_s);
    let (mut child, addr, _out) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "1MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
            "-r",
            &sock_s,
        ],
        Stdio::null(),
    );
    let mut rpc = Rpc::connect(&sock);
    let port = common::port_of(&addr).to_string();
    let tr = rpc.call("nvmf_get_transports", json!({})).unwrap();
    assert_eq!(tr[0]["trtype"], "TCP", "{tr}");
    let e = rpc
        .call("nvmf_create_transport", json!({"trtype": "TCP"}))
        .unwrap_err();
    assert_eq!(e["code"], -32603, "{e}");
    // rpc.py nvmf_create_subsystem LIVE -s SPDK001 (no -a: listed hosts only)
    assert_eq!(
        rpc.call(
            "nvmf_create_subsystem",
            json!({"nqn": LIVE, "serial_number": "SPDK001"})
        ),
        Ok(json!(true))
    );
    let e = rpc
        .call("nvmf_create_subsystem", json!({"nqn": LIVE, "bogus": 1}))
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().contains("bogus"), "{e}");
    // Same address as the first subsystem: one socket.
    let listen = json!({"nqn": LIVE, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port}});
    assert_eq!(
        rpc.call("nvmf_subsystem_add_listener", listen.clone()),
        Ok(json!(true))
    );
    // Not allowed yet, then allowed.
    let (_s, st) = admin_connect(&addr, LIVE, HOST);
    assert_ne!(st, 0, "connect before add_host");
    assert_eq!(
        rpc.call(
            "nvmf_subsystem_add_host",
            json!({"nqn": LIVE, "host": HOST})
        ),
        Ok(json!(true))
    );
    let (mut held, st) = admin_connect(&addr, LIVE, HOST);
    assert_eq!(st, 0, "connect after add_host");
    let subs = rpc.call("nvmf_get_subsystems", json!({})).unwrap();
    let live = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == LIVE)
        .expect("listed");
    assert_eq!(live["serial_number"], "SPDK001");
    assert_eq!(live["allow_any_host"], false);
    assert_eq!(live["hosts"], json!([{"nqn": HOST}]));
    assert_eq!(live["listen_addresses"][0]["trsvcid"], port);
    let ctrls = rpc
        .call("nvmf_subsystem_get_controllers", json!({"nqn": LIVE}))
        .unwrap();
    assert_eq!(ctrls.as_array().unwrap().len(), 1, "{ctrls}");
    assert_eq!(ctrls[0]["hostnqn"], HOST);
    let qps = rpc
        .call("nvmf_subsystem_get_qpairs", json!({"nqn": LIVE}))
        .unwrap();
    assert_eq!(qps[0]["qid"], 0, "{qps}");
    assert_eq!(qps[0]["listen_address"]["trsvcid"], port);
    // The host removed: its connection closes; the first subsystem still
    // takes hosts on the shared socket.
    assert_eq!(
        rpc.call(
            "nvmf_subsystem_remove_host",
            json!({"nqn": LIVE, "host": HOST})
        ),
        Ok(json!(true))
    );
    let mut b = [0u8; 64];
    let closed = loop {
        match held.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(closed, "the removed host's connection was not closed");
    let (_s, st) = admin_connect(&addr, NQN, HOST);
    assert_eq!(st, 0, "the first subsystem");
    assert_eq!(
        rpc.call("nvmf_subsystem_remove_listener", listen),
        Ok(json!(true))
    );
    assert_eq!(
        rpc.call("nvmf_delete_subsystem", json!({"nqn": LIVE})),
        Ok(json!(true))
    );
    let e = rpc
        .call("nvmf_delete_subsystem", json!({"nqn": LIVE}))
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    let e = rpc
        .call("nvmf_get_subsystems", json!({"nqn": LIVE}))
        .unwrap_err();
    assert_eq!(e["code"], -19, "{e}");
    let (_s, st) = admin_connect(&addr, NQN, HOST);
    assert_eq!(st, 0, "the first subsystem, after the delete");
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
    assert!(!sock.exists(), "the RPC socket is removed at exit");
}

/// Stops `pollux target` `child` (SIGTERM) and checks it exited well.
fn stop(mut child: std::process::Child) {
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// `save_config` after live changes restarts the target (`pollux target
/// -c`) with the same subsystems, namespaces, listeners, hosts and
/// transport.
#[test]
fn save_config_restarts_the_target_with_the_same_subsystems() {
    let sock = common::rpc_socket();
    let (child, addr, _out) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "4MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
            "-r",
            &sock,
        ],
        Stdio::null(),
    );
    let port = common::port_of(&addr).to_string();
    let mut rpc = Rpc::connect(Path::new(&sock));
    for (m, p) in [
        (
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN, "allow_any_host": false}),
        ),
        ("nvmf_subsystem_add_host", json!({"nqn": NQN, "host": HOST})),
        (
            "nvmf_create_subsystem",
            json!({"nqn": LIVE, "allow_any_host": true, "model_number": "live model", "max_namespaces": 4}),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": LIVE, "listen_address": {"trtype": "TCP", "traddr": "127.0.0.1", "trsvcid": port}}),
        ),
    ] {
        assert_eq!(rpc.call(m, p.clone()), Ok(json!(true)), "{m} {p}");
    }
    let saved = rpc.call("save_config", json!({})).unwrap();
    let before = rpc.call("nvmf_get_subsystems", json!({})).unwrap();
    let before_tr = rpc.call("nvmf_get_transports", json!({})).unwrap();
    assert_eq!(before[1]["namespaces"][0]["nsid"], 1, "{before}");
    drop(rpc);
    stop(child);
    let dir = std::env::temp_dir().join(format!("pollux-rpc-nvmf-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("saved.json");
    std::fs::write(&file, saved.to_string()).unwrap();
    let sock2 = common::rpc_socket();
    let (child, addr2, _out) = common::start_target(
        &["-c", file.to_str().unwrap(), "-m", "0x1", "-r", &sock2],
        Stdio::null(),
    );
    assert_eq!(addr2, addr);
    let mut rpc = Rpc::connect(Path::new(&sock2));
    assert_eq!(rpc.call("nvmf_get_subsystems", json!({})), Ok(before));
    assert_eq!(rpc.call("nvmf_get_transports", json!({})), Ok(before_tr));
    let (_s, st) = admin_connect(&addr, NQN, HOST);
    assert_eq!(st, 0, "the listed host");
    let (_s, st) = admin_connect(&addr, NQN, "nqn.2014-08.org.nvmexpress:uuid:other");
    assert_ne!(st, 0, "a host not listed");
    drop(rpc);
    stop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `save_config` with live namespaces (malloc bdevs, one at an explicit
/// NSID 5, one numbered by the target): `pollux target -c` serves the
/// same namespaces over the same bdevs, and `pollux perf --verify` (as
/// the listed host) drives both.
#[test]
fn save_config_restores_live_namespaces_with_their_nsids() {
    let sock = common::rpc_socket();
    let (child, addr, _out) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "1MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
            "-r",
            &sock,
        ],
        Stdio::null(),
    );
    let port = common::port_of(&addr).to_string();
    let mut rpc = Rpc::connect(Path::new(&sock));
    for (m, p, want) in [
        (
            "bdev_malloc_create",
            json!({"name": "Mal5", "num_blocks": 4096, "block_size": 512}),
            json!("Mal5"),
        ),
        (
            "bdev_malloc_create",
            json!({"name": "MalA", "num_blocks": 1024, "block_size": 4096}),
            json!("MalA"),
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": LIVE, "serial_number": "SPDK005"}),
            json!(true),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": LIVE, "namespace": {"bdev_name": "Mal5", "nsid": 5}}),
            json!(5),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": LIVE, "namespace": {"bdev_name": "MalA"}}),
            json!(1),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": LIVE, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port}}),
            json!(true),
        ),
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": LIVE, "host": HOST}),
            json!(true),
        ),
    ] {
        assert_eq!(rpc.call(m, p.clone()), Ok(want), "{m} {p}");
    }
    let saved = rpc.call("save_config", json!({})).unwrap();
    let before = rpc.call("nvmf_get_subsystems", json!({})).unwrap();
    let bdevs_before = rpc.call("bdev_get_bdevs", json!({})).unwrap();
    let live = before
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == LIVE)
        .expect("listed")
        .clone();
    let ns: Vec<(u64, String)> = live["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["nsid"].as_u64().unwrap(),
                n["bdev_name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        ns,
        [(1, "MalA".to_string()), (5, "Mal5".to_string())],
        "{live}"
    );
    drop(rpc);
    stop(child);
    let dir = std::env::temp_dir().join(format!("pollux-rpc-nvmf-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("saved.json");
    std::fs::write(&file, saved.to_string()).unwrap();
    let sock2 = common::rpc_socket();
    let (child, addr2, _out) = common::start_target(
        &["-c", file.to_str().unwrap(), "-m", "0x1", "-r", &sock2],
        Stdio::inherit(),
    );
    assert_eq!(addr2, addr);
    let mut rpc = Rpc::connect(Path::new(&sock2));
    assert_eq!(rpc.call("nvmf_get_subsystems", json!({})), Ok(before));
    let names = |v: &Value| -> Vec<(String, u64, u64, String, bool)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().to_string(),
                    b["block_size"].as_u64().unwrap(),
                    b["num_blocks"].as_u64().unwrap(),
                    b["uuid"].as_str().unwrap_or_default().to_string(),
                    b["claimed"].as_bool().unwrap_or_default(),
                )
            })
            .collect()
    };
    let bdevs_after = rpc.call("bdev_get_bdevs", json!({})).unwrap();
    assert_eq!(names(&bdevs_after), names(&bdevs_before));
    // perf as the listed host drives both namespaces, NSID 5 included.
    let trid = format!(
        "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{LIVE} hostnqn:{HOST}"
    );
    let args = [
        "perf",
        "-r",
        &trid,
        "-w",
        "randrw",
        "-q",
        "4",
        "-o",
        "4096",
        "--io-count",
        "1000",
        "-t",
        "20",
        "--verify",
        "--json",
    ];
    let (code, out, err) = common::pollux(&args);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("perf --json: {out}"));
    assert_eq!(v["total"]["errors"], 0, "{out}");
    let devs: Vec<&str> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(devs.len(), 2, "{devs:?}");
    assert!(devs.iter().any(|d| d.contains(" NSID 1 ")), "{devs:?}");
    assert!(devs.iter().any(|d| d.contains(" NSID 5 ")), "{devs:?}");
    drop(rpc);
    stop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--sock-impl uring` target configured over JSON-RPC: a listener
/// naming the target's implementation is added (before, anything but
/// posix was refused), one naming the other is refused naming the
/// target's, and a host connects through the new listener.
#[test]
fn sock_impl_uring_over_json_rpc() {
    let sock_s = common::rpc_socket();
    let sock = PathBuf::from(&sock_s);
    let (child, _addr, _out) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "1MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
            "-r",
            &sock_s,
            "--sock-impl",
            "uring",
        ],
        Stdio::null(),
    );
    let mut rpc = Rpc::connect(&sock);
    assert_eq!(
        rpc.call(
            "nvmf_create_subsystem",
            json!({"nqn": LIVE, "allow_any_host": true})
        ),
        Ok(json!(true))
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    drop(l);
    let listen = |si: &str| json!({"nqn": LIVE, "sock_impl": si, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port}});
    let e = rpc
        .call("nvmf_subsystem_add_listener", listen("posix"))
        .unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().contains("uring"), "{e}");
    assert_eq!(
        rpc.call("nvmf_subsystem_add_listener", listen("uring")),
        Ok(json!(true))
    );
    let (_s, st) = admin_connect(&format!("127.0.0.1:{port}"), LIVE, HOST);
    assert_eq!(st, 0, "connect through the uring listener");
    drop(rpc);
    stop(child);
}

/// The ANA names over JSON-RPC: `nvmf_create_subsystem` `ana_reporting`,
/// `min_cntlid`, `max_cntlid`; `nvmf_subsystem_add_ns` `uuid`, `nguid`,
/// `eui64`, `anagrpid`; `nvmf_subsystem_add_listener` `ana_state`;
/// `nvmf_subsystem_listener_set_ana_state`; each bad value named.
#[test]
fn ana_methods_over_json_rpc() {
    let sock_s = common::rpc_socket();
    let sock = PathBuf::from(&sock_s);
    let (child, _addr, _out) = common::start_target(
        &[
            "--listen",
            "127.0.0.1:0",
            "--ram",
            "1MiB",
            "--nqn",
            NQN,
            "-m",
            "0x1",
            "-r",
            &sock_s,
        ],
        Stdio::null(),
    );
    let mut rpc = Rpc::connect(&sock);
    rpc.call(
        "bdev_malloc_create",
        json!({"name": "M0", "num_blocks": 2048, "block_size": 512}),
    )
    .unwrap();
    let e = rpc
        .call(
            "nvmf_create_subsystem",
            json!({"nqn": LIVE, "min_cntlid": 50, "max_cntlid": 40}),
        )
        .unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("50-40"), "{e}");
    rpc.call(
        "nvmf_create_subsystem",
        json!({"nqn": LIVE, "allow_any_host": true, "ana_reporting": true, "min_cntlid": 40, "max_cntlid": 49}),
    )
    .unwrap();
    let ns = |extra: Value| {
        let mut n = json!({"bdev_name": "M0"});
        for (k, v) in extra.as_object().unwrap() {
            n[k] = v.clone();
        }
        json!({"nqn": LIVE, "namespace": n})
    };
    for (bad, name) in [
        (json!({"uuid": "x"}), "namespace.uuid"),
        (json!({"nguid": "00"}), "namespace.nguid"),
        (json!({"eui64": "00"}), "namespace.eui64"),
        (json!({"anagrpid": 0}), "namespace.anagrpid"),
    ] {
        let e = rpc.call("nvmf_subsystem_add_ns", ns(bad)).unwrap_err();
        assert!(e["message"].as_str().unwrap().contains(name), "{e}");
    }
    assert_eq!(
        rpc.call(
            "nvmf_subsystem_add_ns",
            ns(json!({"uuid": "6b1e0a51-2c4d-4e8f-9a01-112233445566", "nguid": "00112233445566778899aabbccddeeff", "eui64": "0011223344556677", "anagrpid": 4})),
        ),
        Ok(json!(1))
    );
    let la = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"});
    let e = rpc
        .call(
            "nvmf_subsystem_add_listener",
            json!({"nqn": LIVE, "listen_address": la, "ana_state": "sideways"}),
        )
        .unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("ana_state"), "{e}");
    rpc.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": LIVE, "listen_address": la, "ana_state": "non_optimized"}),
    )
    .unwrap();
    let subs = rpc
        .call("nvmf_get_subsystems", json!({"nqn": LIVE}))
        .unwrap();
    let s = &subs[0];
    assert_eq!(
        (&s["ana_reporting"], &s["min_cntlid"], &s["max_cntlid"]),
        (&json!(true), &json!(40), &json!(49)),
        "{s}"
    );
    let n = &s["namespaces"][0];
    assert_eq!(n["uuid"], "6b1e0a51-2c4d-4e8f-9a01-112233445566", "{n}");
    assert_eq!(n["nguid"], "00112233445566778899aabbccddeeff", "{n}");
    assert_eq!(n["anagrpid"], 4, "{n}");
    let real = s["listen_addresses"][0].clone();
    let set = |st: &str, g: Option<u32>| {
        let mut p = json!({"nqn": LIVE, "listen_address": real, "ana_state": st});
        if let Some(g) = g {
            p["anagrpid"] = g.into();
        }
        p
    };
    assert_eq!(
        rpc.call(
            "nvmf_subsystem_listener_set_ana_state",
            set("inaccessible", Some(4))
        ),
        Ok(json!(true))
    );
    let e = rpc
        .call("nvmf_subsystem_listener_set_ana_state", set("change", None))
        .unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("'change'"), "{e}");
    let saved = rpc.call("save_config", json!({})).unwrap().to_string();
    assert!(saved.contains(r#""ana_state":"non_optimized""#), "{saved}");
    assert!(
        saved.contains(r#""anagrpid":4,"#) || saved.contains(r#""anagrpid":4}"#),
        "{saved}"
    );
    assert!(saved.contains(r#""ana_state":"inaccessible""#), "{saved}");
    stop(child);
}
