//! The target configured while hosts are connected (`Target`'s live API,
//! what the `nvmf_*` JSON-RPC methods call): a subsystem created live is
//! reachable; removing a host, a listener or a subsystem closes what it
//! must and nothing else (other hosts keep doing verified I/O, through
//! pollux's TCP host); the listings; `save_config` read back by a second
//! target gives the same subsystems.
mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use pollux_bdev::Bdev;
use pollux_host::{ControllerOptions, IoBuf, QpairOptions, Trid};
use pollux_nvmf::{
    LiveError, NamespaceConfig, RuntimeOptions, SubsystemConfig, SubsystemOptions, Target,
    TargetConfig, TransportOptions,
};
use pollux_spec::Status;
use serde_json::{json, Value};

const SUB2: &str = "nqn.2024-01.io.pollux:sub2";
const LIVE: &str = "nqn.2024-01.io.pollux:live";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A target with `SUB1` on `Malloc0` and `SUB2` on `Malloc1` (hosts A
/// and B only), both on one free port.
fn two_subsystems() -> Target {
    let mut cfg = TargetConfig::default();
    for (nqn, bdev) in [(SUB1, "Malloc0"), (SUB2, "Malloc1")] {
        cfg.bdevs.push(Bdev::ram(bdev, 512, 8192).unwrap());
        let mut s = SubsystemConfig::new(nqn);
        s.allow_any_host = false;
        s.hosts = vec![HOST_A.into(), HOST_B.into()];
        s.namespaces.push(NamespaceConfig {
            bdev: bdev.into(),
            nsid: None,
            ..Default::default()
        });
        s.listeners.push(any());
        cfg.subsystems.push(s);
    }
    Target::start(cfg, &[0], RuntimeOptions::default()).unwrap()
}

/// A controller of `sub` for `host` through `addr`, brought up, and its
/// I/O queue 1 (PDU-level host).
fn connect(addr: SocketAddr, sub: &str, host: &str) -> (Client, Client) {
    let mut a = Client::connect(addr);
    a.ic(pollux_spec::tcp::Digests::NONE);
    let cntlid = a.bring_up(sub, host, 0);
    let mut q = Client::connect(addr);
    q.ic(pollux_spec::tcp::Digests::NONE);
    let r = q.connect_cmd(1, 31, 0, cntlid, sub, host, false);
    assert!(r.status().is_success(), "I/O connect: {:#x}", r.status().0);
    (a, q)
}

/// Writes then reads back 4 KiB at `slba` of namespace 1.
fn verified_io(q: &mut Client, slba: u64, seed: u8) {
    let data = pattern(4096, seed);
    assert_eq!(q.write(1, slba, &data, false).status(), Status::SUCCESS);
    let (got, cqe) = q.read(1, slba, 4096);
    assert!(cqe.is_none_or(|c| c.status() == Status::SUCCESS));
    assert_eq!(got, data);
}

/// A pollux TCP host's controller of `sub` as `host` through `addr`.
fn pollux_host(addr: SocketAddr, sub: &str, host: &str) -> pollux_host::Controller {
    let t: Trid = format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:{sub} hostnqn:{host}",
        addr.ip(),
        addr.port()
    )
    .parse()
    .unwrap();
    pollux_host::connect(&t, &ControllerOptions::default()).expect("pollux host connect")
}

/// Writes then reads back 4 KiB at `lba` through the pollux host.
fn host_io(c: &pollux_host::Controller, lba: u64, seed: u8) {
    let ns = c.namespaces()[0];
    let mut qp = c
        .alloc_qpair(QpairOptions {
            depth: 16,
            ..Default::default()
        })
        .unwrap();
    let nlb = 4096 >> ns.lba_shift();
    let data = pattern(4096, seed);
    let mut w = c.alloc_dma(4096).unwrap();
    w.as_mut_slice().copy_from_slice(&data);
    qp.write(&ns, lba, nlb, IoBuf::new(w), 1).unwrap();
    let mut ok = 0;
    qp.drain(Duration::from_secs(20), |_, c| {
        assert!(c.result.is_ok(), "write: {:?}", c.result);
        ok += 1;
    })
    .unwrap();
    let r = c.alloc_dma(4096).unwrap();
    qp.read(&ns, lba, nlb, IoBuf::new(r), 2).unwrap();
    let mut got = None;
    qp.drain(Duration::from_secs(20), |_, c| {
        assert!(c.result.is_ok(), "read: {:?}", c.result);
        got = c.buf;
    })
    .unwrap();
    assert_eq!(ok, 1);
    assert_eq!(got.expect("read buffer").as_slice(), &data[..]);
}

/// Waits until `f` holds (the target closes connections on its threads).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn nqns(t: &Target) -> Vec<String> {
    t.subsystems()
        .iter()
        .map(|s| s["nqn"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_empty_target_is_configured_live_and_serves_a_host() {
    let t = Target::start(TargetConfig::default(), &[0], RuntimeOptions::default()).unwrap();
    assert!(t.listen_addrs().is_empty());
    assert!(t.transports().is_empty());
    // No listener without a transport (as SPDK).
    t.create_subsystem(
        LIVE,
        SubsystemOptions {
            allow_any_host: true,
            serial_number: Some("SN-LIVE".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        t.add_listener(LIVE, any()),
        Err(LiveError::NoTransport)
    ));
    // The transport's options are the subsystems' limits: first.
    assert!(matches!(
        t.create_transport(TransportOptions::default()),
        Err(LiveError::TransportTooLate)
    ));
    t.delete_subsystem(LIVE).unwrap();
    // The threads' receive gates are set up when they start: a change is
    // refused by name, not ignored.
    let e = t
        .create_transport(TransportOptions {
            epoll_receive: true,
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            LiveError::ChosenAtStart {
                option: "epoll_receive",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("epoll_receive true"), "{e}");
    // So are the io_uring threads' ring options: a registered buffer
    // region (with the zero-copy threshold it needs) is refused, the first
    // option that differs named.
    let e = t
        .create_transport(TransportOptions {
            uring_zcopy_threshold: 65536,
            uring_registered_buffers: 1 << 20,
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("uring_zcopy_threshold 65536: the target's threads were started with 0"),
        "{e}"
    );
    let e = t
        .create_transport(TransportOptions {
            uring_registered_buffers: 1 << 20,
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        e.to_string().contains("uring_registered_buffers")
            && e.to_string().contains("set uring_zcopy_threshold too"),
        "{e}"
    );
    let o = TransportOptions {
        max_queue_depth: 64,
        ..Default::default()
    };
    t.create_transport(o).unwrap();
    let e = t.create_transport(TransportOptions::default()).unwrap_err();
    assert!(matches!(e, LiveError::TransportExists), "{e}");
    assert_eq!(e.errno(), libc::EEXIST);
    let tr = t.transports();
    assert_eq!(tr.len(), 1);
    assert_eq!(tr[0]["trtype"], "TCP");
    assert_eq!(tr[0]["max_queue_depth"], 64);
    for k in [
        "max_io_qpairs_per_ctrlr",
        "in_capsule_data_size",
        "max_io_size",
        "io_unit_size",
        "max_aq_depth",
        "num_shared_buffers",
        "buf_cache_size",
        "dif_insert_or_strip",
        "c2h_success",
        "sock_priority",
        "abort_timeout_sec",
    ] {
        assert!(tr[0].get(k).is_some(), "nvmf_get_transports lacks {k}");
    }
    t.create_subsystem(
        LIVE,
        SubsystemOptions {
            allow_any_host: true,
            ..Default::default()
        },
    )
    .unwrap();
    let e = t
        .create_subsystem(LIVE, SubsystemOptions::default())
        .unwrap_err();
    assert!(matches!(e, LiveError::SubsystemExists { .. }), "{e}");
    let addr = t.add_listener(LIVE, any()).unwrap();
    assert_ne!(addr.port(), 0);
    assert_eq!(t.listen_addrs(), vec![addr]);
    // Reachable, with the transport's limits (CAP.MQES = 63).
    let (mut a, _q) = connect(addr, LIVE, HOST_A);
    let cap = a.prop_get(0, pollux_spec::fabrics::PropertySize::Eight);
    assert_eq!(cap.dw0 & 0xFFFF, 63);
    let s = &t.subsystems()[1];
    assert_eq!(s["nqn"], LIVE);
    assert_eq!(s["subtype"], "NVMe");
    assert_eq!(s["allow_any_host"], true);
    assert_eq!(s["namespaces"], json!([]));
    assert_eq!(
        s["listen_addresses"],
        json!([{"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": addr.port().to_string()}])
    );
    assert_eq!(t.subsystems()[0]["subtype"], "Discovery");
    let ctrls = t.subsystem_controllers(LIVE).unwrap();
    assert_eq!(ctrls.len(), 1);
    assert_eq!(ctrls[0]["hostnqn"], HOST_A);
    assert_eq!(ctrls[0]["num_io_qpairs"], 1);
    assert_eq!(ctrls[0]["cntrltype"], "io");
    let qps = t.subsystem_qpairs(LIVE).unwrap();
    assert_eq!(qps.len(), 2);
    assert_eq!(qps[0]["qid"], 0);
    assert_eq!(qps[1]["qid"], 1);
    assert_eq!(qps[1]["state"], "enabled");
    assert_eq!(qps[1]["listen_address"]["trsvcid"], addr.port().to_string());
    assert!(matches!(
        t.subsystem_qpairs("nqn.2024-01.io.pollux:none"),
        Err(LiveError::NoSubsystem { .. })
    ));
    t.shutdown().unwrap();
}

#[test]
fn remove_host_closes_only_that_hosts_controllers() {
    let t = two_subsystems();
    let addr = t.listen_addrs()[0];
    let (mut a_adm, mut a_io) = connect(addr, SUB1, HOST_A);
    let (_b_adm, mut b_io) = connect(addr, SUB1, HOST_B);
    // Host A of the other subsystem stays too.
    let other = pollux_host(addr, SUB2, HOST_A);
    verified_io(&mut a_io, 0, 1);
    t.remove_host(SUB1, HOST_A).unwrap();
    a_io.expect_eof();
    a_adm.expect_eof();
    verified_io(&mut b_io, 8, 2);
    host_io(&other, 16, 3);
    // Refused now; B's list still has B.
    let mut c = Client::connect(addr);
    c.ic(pollux_spec::tcp::Digests::NONE);
    assert!(!c.admin_connect(SUB1, HOST_A, 0).status().is_success());
    let e = t.remove_host(SUB1, HOST_A).unwrap_err();
    assert!(matches!(e, LiveError::NoHost { .. }), "{e}");
    assert_eq!(t.subsystems()[1]["hosts"], json!([{"nqn": HOST_B}]));
    // Added back (and any host allowed): it connects again.
    t.add_host(SUB1, HOST_A).unwrap();
    let (_a2, mut a2_io) = connect(addr, SUB1, HOST_A);
    verified_io(&mut a2_io, 24, 4);
    t.allow_any_host(SUB1, true).unwrap();
    let (_c, mut c_io) = connect(
        addr,
        SUB1,
        "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000003",
    );
    verified_io(&mut c_io, 32, 5);
    t.shutdown().unwrap();
}

#[test]
fn remove_listener_closes_only_that_subsystems_queues_through_it() {
    let t = two_subsystems();
    let shared = t.listen_addrs()[0];
    let second = t.add_listener(SUB1, any()).unwrap();
    assert_eq!(t.listen_addrs().len(), 2);
    // SUB1 through both listeners, SUB2 through the shared one.
    let (mut via_shared_adm, mut via_shared_io) = connect(shared, SUB1, HOST_A);
    let (_via_second_adm, mut via_second_io) = connect(second, SUB1, HOST_B);
    // An I/O queue of a controller whose admin queue came through the
    // other listener is closed alone.
    let (_mixed_adm, mut mixed_io) = {
        let mut a = Client::connect(second);
        a.ic(pollux_spec::tcp::Digests::NONE);
        let cntlid = a.bring_up(SUB1, HOST_A, 0);
        let mut q = Client::connect(shared);
        q.ic(pollux_spec::tcp::Digests::NONE);
        assert!(q
            .connect_cmd(1, 31, 0, cntlid, SUB1, HOST_A, false)
            .status()
            .is_success());
        (a, q)
    };
    let other = pollux_host(shared, SUB2, HOST_B);
    host_io(&other, 0, 1);
    t.remove_listener(SUB1, shared).unwrap();
    via_shared_io.expect_eof();
    via_shared_adm.expect_eof();
    mixed_io.expect_eof();
    verified_io(&mut via_second_io, 8, 2);
    host_io(&other, 16, 3);
    // The socket stays for SUB2; SUB1 is not served there any more.
    let mut c = Client::connect(shared);
    c.ic(pollux_spec::tcp::Digests::NONE);
    assert!(!c.admin_connect(SUB1, HOST_A, 0).status().is_success());
    let mut c = Client::connect(shared);
    c.ic(pollux_spec::tcp::Digests::NONE);
    assert!(c.admin_connect(SUB2, HOST_A, 0).status().is_success());
    let e = t.remove_listener(SUB1, shared).unwrap_err();
    assert!(matches!(e, LiveError::NoListener { .. }), "{e}");
    // SUB1's controllers whose admin queue came through the second
    // listener stay (one of them without its I/O queue).
    eventually(
        "SUB1's controller through the removed listener gone",
        || t.subsystem_controllers(SUB1).unwrap().len() == 2,
    );
    let ctrls = t.subsystem_controllers(SUB1).unwrap();
    let io: Vec<u64> = ctrls
        .iter()
        .map(|c| c["num_io_qpairs"].as_u64().unwrap())
        .collect();
    assert!(io.contains(&0) && io.contains(&1), "{ctrls:?}");
    // The last subsystem on it leaves: the socket closes.
    drop(other);
    t.remove_listener(SUB2, shared).unwrap();
    assert_eq!(t.listen_addrs(), vec![second]);
    assert!(
        TcpStream::connect(shared).is_err(),
        "{shared} still listens"
    );
    verified_io(&mut via_second_io, 24, 4);
    t.shutdown().unwrap();
}

#[test]
fn delete_subsystem_closes_its_controllers_only() {
    let t = two_subsystems();
    let addr = t.listen_addrs()[0];
    let (mut adm, mut io) = connect(addr, SUB1, HOST_A);
    let other = pollux_host(addr, SUB2, HOST_A);
    verified_io(&mut io, 0, 1);
    t.delete_subsystem(SUB1).unwrap();
    io.expect_eof();
    adm.expect_eof();
    host_io(&other, 8, 2);
    assert_eq!(
        nqns(&t),
        vec![
            "nqn.2014-08.org.nvmexpress.discovery".to_string(),
            SUB2.into()
        ]
    );
    let e = t.delete_subsystem(SUB1).unwrap_err();
    assert!(matches!(e, LiveError::NoSubsystem { .. }), "{e}");
    assert_eq!(e.errno(), libc::ENODEV);
    let mut c = Client::connect(addr);
    c.ic(pollux_spec::tcp::Digests::NONE);
    assert!(!c.admin_connect(SUB1, HOST_A, 0).status().is_success());
    // Created again under the same NQN: a new subsystem, reachable.
    t.create_subsystem(
        SUB1,
        SubsystemOptions {
            allow_any_host: true,
            ..Default::default()
        },
    )
    .unwrap();
    t.add_listener(SUB1, addr).unwrap();
    let (_a, _q) = connect(addr, SUB1, HOST_B);
    eventually("the deleted subsystem's controller gone", || {
        t.controllers() == 2
    });
    t.shutdown().unwrap();
}

/// SPDK's JSON configuration of `nvmf` entries and a RAM bdev per name.
fn config_doc(bdevs: &[&str], nvmf: Vec<Value>) -> String {
    let b: Vec<Value> = bdevs
        .iter()
        .map(|n| json!({"method": "bdev_malloc_create", "params": {"name": n, "num_blocks": 8192, "block_size": 512}}))
        .collect();
    json!({"subsystems": [
        {"subsystem": "bdev", "config": b},
        {"subsystem": "nvmf", "config": nvmf},
    ]})
    .to_string()
}

#[test]
fn save_config_starts_a_target_with_the_same_subsystems() {
    let doc = config_doc(
        &["Malloc0", "Malloc1"],
        vec![
            json!({"method": "nvmf_create_transport", "params": {"trtype": "TCP", "max_queue_depth": 32, "icreq_timeout_ms": 5000}}),
            json!({"method": "nvmf_create_subsystem", "params": {"nqn": SUB1, "serial_number": "SN1", "model_number": "M1", "max_namespaces": 8}}),
            json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUB1, "namespace": {"bdev_name": "Malloc0"}}}),
            json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUB1, "namespace": {"bdev_name": "Malloc1"}}}),
            json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": SUB1, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"}}}),
        ],
    );
    let cfg = TargetConfig::from_json(&doc).unwrap();
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    // Live: a host, a second subsystem with its hosts and listeners.
    t.add_host(SUB1, HOST_A).unwrap();
    t.create_subsystem(
        SUB2,
        SubsystemOptions {
            serial_number: Some("SN2".into()),
            ..Default::default()
        },
    )
    .unwrap();
    t.add_host(SUB2, HOST_B).unwrap();
    let l1 = t.listen_addrs()[0];
    t.add_listener(SUB2, l1).unwrap();
    t.add_listener(SUB2, any()).unwrap();
    t.create_subsystem(
        LIVE,
        SubsystemOptions {
            allow_any_host: true,
            ..Default::default()
        },
    )
    .unwrap();
    t.add_listener("discovery", any()).unwrap();
    let saved = t.save_config_nvmf();
    let methods: Vec<&str> = saved
        .iter()
        .map(|e| e["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods[0], "nvmf_create_transport");
    // The discovery subsystem's own listener, not the subsystem itself.
    assert!(saved
        .iter()
        .any(|e| e["method"] == "nvmf_subsystem_add_listener" && e["params"]["nqn"] == DISCOVERY));
    assert!(!saved
        .iter()
        .any(|e| e["method"] == "nvmf_create_subsystem" && e["params"]["nqn"] == DISCOVERY));
    assert_eq!(saved[0]["params"]["max_queue_depth"], 32);
    assert_eq!(saved[0]["params"]["icreq_timeout_ms"], 5000);
    let before = t.subsystems();
    assert_eq!(before[1]["namespaces"].as_array().unwrap().len(), 2);
    assert_eq!(before[1]["max_namespaces"], 8);
    let before_tr = t.transports();
    t.shutdown().unwrap();
    drop(t);
    // `pollux target -c` reads the same document shape.
    let cfg = TargetConfig::from_json(&config_doc(&["Malloc0", "Malloc1"], saved)).unwrap();
    let t2 = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    assert_eq!(t2.subsystems(), before);
    assert_eq!(t2.transports(), before_tr);
    // And it serves them.
    let (_a, mut q) = connect(l1, SUB1, HOST_A);
    verified_io(&mut q, 0, 9);
    t2.shutdown().unwrap();
}

/// The `nvmf_create_transport` entry of a `save_config`.
fn saved_transport(saved: &[Value]) -> &Value {
    let e = saved
        .iter()
        .find(|e| e["method"] == "nvmf_create_transport")
        .expect("save_config wrote no nvmf_create_transport");
    &e["params"]
}

/// Every transport option the configuration reads, none at its default
/// (io_uring sockets with all their options), survives `save_config`
/// read back: the whole `TransportOptions`, and the very parameters
/// (before: `sock_impl` and the `uring_*` options were not written, the
/// second target ran posix sockets; `incoming_cpu`, `epoll_idle`,
/// `direct_receive`, `max_connections`, ... had no key at all).
#[test]
fn save_config_keeps_every_transport_option_of_a_uring_target() {
    let params = json!({
        "trtype": "TCP",
        "max_queue_depth": 64,
        "max_io_qpairs_per_ctrlr": 7,
        "in_capsule_data_size": 8192,
        "max_io_size": 65536,
        "io_unit_size": 8192,
        "max_aq_depth": 32,
        "num_shared_buffers": 1023,
        "buf_cache_size": 32,
        "dif_insert_or_strip": false,
        "kas": 5,
        "icreq_timeout_ms": 4000,
        "connect_timeout_ms": 6000,
        "auth_timeout_ms": 7000,
        "send_iov": 64,
        "max_unbound_connections": 32,
        "data_timeout_ms": 9000,
        "busy_poll_us": 50,
        "sock_impl": "uring",
        "uring_fixed_files": false,
        "uring_rx_buffers": 256,
        "uring_rx_buffer_size": 8192,
        "uring_zcopy_threshold": 16384,
        "uring_registered_buffers": 1048576,
        "admin_in_capsule_data_size": 16384,
        "max_h2c_data": 65536,
        "max_connections": 100,
        "rx_buffer_size": 32768,
        "incoming_cpu": true,
        "epoll_idle": false,
        "direct_receive": false,
        "epoll_receive": true,
        "send_buffer": 196608,
    });
    let doc = |p: &Value| {
        config_doc(
            &[],
            vec![json!({"method": "nvmf_create_transport", "params": p})],
        )
    };
    let cfg = TargetConfig::from_json(&doc(&params)).unwrap();
    let opts = cfg.transport.clone();
    let d = TransportOptions::default();
    assert_eq!(opts.sock_impl, pollux_nvmf::SockImpl::Uring);
    assert_ne!(opts.uring_fixed_files, d.uring_fixed_files);
    assert_ne!(opts.uring_rx_buffers, d.uring_rx_buffers);
    assert_ne!(opts.uring_rx_buffer_size, d.uring_rx_buffer_size);
    assert_ne!(opts.uring_zcopy_threshold, d.uring_zcopy_threshold);
    assert_ne!(opts.uring_registered_buffers, d.uring_registered_buffers);
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    let saved = t.save_config_nvmf();
    t.shutdown().unwrap();
    drop(t);
    assert_eq!(saved_transport(&saved), &params);
    let back = TargetConfig::from_json(&doc(saved_transport(&saved))).unwrap();
    assert_eq!(back.transport, opts);
    let t2 = Target::start(back, &[0], RuntimeOptions::default()).unwrap();
    assert_eq!(t2.sock_impl(), pollux_nvmf::SockImpl::Uring);
    t2.shutdown().unwrap();
}

/// A uring target started with registered buffers (set up with each
/// thread's ring) refuses a live `nvmf_create_transport` that asks for
/// none or another size, naming the option and both sizes; one that keeps
/// the size is taken and `nvmf_get_transports` lists it.
#[test]
fn a_live_transport_keeps_the_registered_buffers_the_threads_started_with() {
    let zc = TransportOptions {
        sock_impl: pollux_nvmf::SockImpl::Uring,
        uring_zcopy_threshold: 65536,
        ..Default::default()
    };
    let with = |bytes: u32| TransportOptions {
        uring_registered_buffers: bytes,
        ..zc.clone()
    };
    let cfg = TargetConfig {
        transport: with(1 << 20),
        ..Default::default()
    };
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    for asked in [0, 2 << 20] {
        let e = t.create_transport(with(asked)).unwrap_err();
        assert!(
            matches!(
                e,
                LiveError::ChosenAtStart {
                    option: "uring_registered_buffers",
                    ..
                }
            ),
            "{e}"
        );
        let want = format!(
            "uring_registered_buffers {asked}: the target's threads were started with 1048576"
        );
        assert!(e.to_string().contains(&want), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    assert!(t.transports().is_empty());
    t.create_transport(with(1 << 20)).unwrap();
    let tr = t.transports();
    assert_eq!(tr[0]["uring_registered_buffers"], 1 << 20, "{}", tr[0]);
    t.shutdown().unwrap();
}

/// The io_uring threads' rings are set up when they start: a live
/// `nvmf_create_transport` that changes any of their options (provided
/// receive buffers, registered files, zero-copy sends) is refused by
/// name, with both values (before, it was taken and silently ignored by
/// the running threads); the same options are taken.
#[test]
fn a_live_transport_keeps_the_ring_options_the_threads_started_with() {
    let started = TransportOptions {
        sock_impl: pollux_nvmf::SockImpl::Uring,
        ..Default::default()
    };
    let cfg = TargetConfig {
        transport: started.clone(),
        ..Default::default()
    };
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    let cases: [(&str, TransportOptions, &str, &str); 4] = [
        (
            "uring_fixed_files",
            TransportOptions {
                uring_fixed_files: false,
                ..started.clone()
            },
            "false",
            "true",
        ),
        (
            "uring_rx_buffers",
            TransportOptions {
                uring_rx_buffers: 64,
                ..started.clone()
            },
            "64",
            "512",
        ),
        (
            "uring_rx_buffer_size",
            TransportOptions {
                uring_rx_buffer_size: 4096,
                ..started.clone()
            },
            "4096",
            "16384",
        ),
        (
            "uring_zcopy_threshold",
            TransportOptions {
                uring_zcopy_threshold: 65536,
                ..started.clone()
            },
            "65536",
            "0",
        ),
    ];
    for (name, asked, a, r) in cases {
        let e = t.create_transport(asked).unwrap_err();
        assert!(
            matches!(e, LiveError::ChosenAtStart { option, .. } if option == name),
            "{name}: {e}"
        );
        let want = format!("{name} {a}: the target's threads were started with {r}");
        assert!(e.to_string().contains(&want), "{e}");
    }
    assert!(t.transports().is_empty());
    t.create_transport(started).unwrap();
    assert_eq!(t.transports().len(), 1);
    t.shutdown().unwrap();
}

/// SPDK's `save_config` of a listener with a `sock_impl` (it writes
/// `secure_channel` and `sock_impl` after the address) starts a target
/// whose transport runs that implementation, and the target refuses to
/// start when the transport runs another, naming the key and both.
#[test]
fn a_listeners_sock_impl_starts_a_target_of_that_implementation_only() {
    let doc = |transport: Value| {
        config_doc(
            &["Malloc0"],
            vec![
                json!({"method": "nvmf_create_transport", "params": transport}),
                json!({"method": "nvmf_create_subsystem", "params": {"nqn": SUB1, "allow_any_host": true}}),
                json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": SUB1, "namespace": {"bdev_name": "Malloc0"}}}),
                json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": SUB1,
                    "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "0"},
                    "secure_channel": false, "sock_impl": "uring"}}),
            ],
        )
    };
    let cfg =
        TargetConfig::from_json(&doc(json!({"trtype": "TCP", "sock_impl": "uring"}))).unwrap();
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    assert_eq!(t.sock_impl(), pollux_nvmf::SockImpl::Uring);
    t.shutdown().unwrap();
    drop(t);
    let cfg = TargetConfig::from_json(&doc(json!({"trtype": "TCP"}))).unwrap();
    let e = Target::start(cfg, &[0], RuntimeOptions::default())
        .err()
        .expect("a uring listener on a posix transport")
        .to_string();
    assert!(
        e.contains(SUB1)
            && e.contains("parameter 'sock_impl' is 'uring'")
            && e.contains("the transport's sock_impl is 'posix'"),
        "{e}"
    );
}

/// SPDK v25.09's `nvmf_create_transport` parameters and their types
/// (lib/nvmf/nvmf_rpc.c `nvmf_rpc_create_transport_decoder`, lib/nvmf/tcp.c
/// `tcp_transport_opts_decoder`).
const SPDK_TRANSPORT_PARAMS: &[(&str, &str)] = &[
    ("trtype", "string"),
    ("max_queue_depth", "u16"),
    ("max_io_qpairs_per_ctrlr", "u16"),
    ("in_capsule_data_size", "u32"),
    ("max_io_size", "u32"),
    ("io_unit_size", "u32"),
    ("max_aq_depth", "u32"),
    ("num_shared_buffers", "u32"),
    ("buf_cache_size", "u32"),
    ("dif_insert_or_strip", "bool"),
    ("abort_timeout_sec", "u32"),
    ("zcopy", "bool"),
    ("tgt_name", "string"),
    ("acceptor_poll_rate", "u32"),
    ("ack_timeout", "u32"),
    ("data_wr_pool_size", "u32"),
    ("disable_command_passthru", "bool"),
    ("kas", "u16"),
    ("min_kato", "u32"),
    ("c2h_success", "bool"),
    ("control_msg_num", "u16"),
    ("sock_priority", "u32"),
];

/// A default target's saved `nvmf_create_transport` has SPDK's keys
/// only, each of SPDK's type (pollux's own options, `sock_impl` and the
/// `uring_*` ones among them, are written only when not the default), and
/// reads back to the default options.
#[test]
fn save_config_of_a_default_transport_has_spdks_keys_only() {
    let doc = |p: &Value| {
        config_doc(
            &[],
            vec![json!({"method": "nvmf_create_transport", "params": p})],
        )
    };
    let cfg = TargetConfig::from_json(&doc(&json!({"trtype": "TCP"}))).unwrap();
    assert_eq!(cfg.transport, TransportOptions::default());
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    let saved = t.save_config_nvmf();
    t.shutdown().unwrap();
    drop(t);
    let p = saved_transport(&saved);
    for (k, v) in p.as_object().unwrap() {
        let (_, ty) = SPDK_TRANSPORT_PARAMS
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("'{k}' is not an SPDK nvmf_create_transport parameter"));
        let fits = match *ty {
            "string" => v.is_string(),
            "bool" => v.is_boolean(),
            "u16" => v.as_u64().is_some_and(|n| n <= u16::MAX as u64),
            "u32" => v.as_u64().is_some_and(|n| n <= u32::MAX as u64),
            _ => unreachable!(),
        };
        assert!(fits, "'{k}': {v} is not SPDK's {ty}");
    }
    let back = TargetConfig::from_json(&doc(p)).unwrap();
    assert_eq!(back.transport, TransportOptions::default());
}

/// A wildcard listener (0.0.0.0) serves connections to any of the
/// machine's addresses on its port, and they are its queues (before: a
/// Connect through it was refused, "the subsystem does not listen on
/// 127.0.0.1:PORT").
#[test]
fn a_wildcard_listener_serves_and_its_removal_closes_its_queues() {
    let t = two_subsystems();
    let wild = t.add_listener(SUB1, "0.0.0.0:0".parse().unwrap()).unwrap();
    assert!(wild.ip().is_unspecified());
    let via: SocketAddr = format!("127.0.0.1:{}", wild.port()).parse().unwrap();
    let (mut adm, mut io) = connect(via, SUB1, HOST_A);
    verified_io(&mut io, 0, 7);
    let qps = t.subsystem_qpairs(SUB1).unwrap();
    assert!(
        qps.iter()
            .all(|q| q["listen_address"]["traddr"] == "0.0.0.0"),
        "{qps:?}"
    );
    t.remove_listener(SUB1, wild).unwrap();
    io.expect_eof();
    adm.expect_eof();
    t.shutdown().unwrap();
}

/// The discovery subsystem listens where it is told too (SPDK's
/// `nvmf_subsystem_add_listener discovery ...`, e.g. port 8009): only
/// discovery is served there; its removal closes the discovery
/// controllers that came through it, and the socket.
#[test]
fn the_discovery_subsystem_gets_a_listener_of_its_own() {
    let t = two_subsystems();
    let d = t.add_listener("discovery", any()).unwrap();
    let e = t.add_listener(DISCOVERY, d).unwrap_err();
    assert!(matches!(e, LiveError::ListenerExists { .. }), "{e}");
    assert_eq!(
        t.subsystems()[0]["listen_addresses"][0]["trsvcid"],
        d.port().to_string()
    );
    let mut c = Client::connect(d);
    c.ic(pollux_spec::tcp::Digests::NONE);
    assert!(c.admin_connect(DISCOVERY, HOST_A, 0).status().is_success());
    let mut n = Client::connect(d);
    n.ic(pollux_spec::tcp::Digests::NONE);
    assert!(!n.admin_connect(SUB1, HOST_A, 0).status().is_success());
    assert_eq!(t.subsystem_controllers(DISCOVERY).unwrap().len(), 1);
    t.remove_listener("discovery", d).unwrap();
    c.expect_eof();
    assert!(t.subsystems()[0]["listen_addresses"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(TcpStream::connect(d).is_err(), "{d} still listens");
    t.shutdown().unwrap();
}
