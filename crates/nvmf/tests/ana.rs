//! ANA multipath on the target over TCP: per-listener ANA states in the
//! ANA log page and on I/O, the ANA Change event when a state is set
//! live or by a reload of the configuration, controller ID ranges,
//! configured namespace identifiers, and the JSON configuration's names
//! (each accepted, each bad value named).
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use pollux_bdev::Bdev;
use pollux_nvmf::{AnaState, NamespaceConfig, NsIds, SubsystemConfig, TargetConfig};
use pollux_spec::cmd::cns;
use pollux_spec::features::{aer, fid};
use pollux_spec::identify::{IdentifyController, IdentifyNamespace, CMIC_ANA};
use pollux_spec::log::{lid, AnaLog};
use pollux_spec::status::{path, sct};
use pollux_spec::tcp::Digests;
use pollux_spec::Sqe;
use zerocopy::FromBytes;

const UUID: [u8; 16] = [
    0x6b, 0x1e, 0x0a, 0x51, 0x2c, 0x4d, 0x4e, 0x8f, 0x9a, 0x01, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
];

/// `SUB1` with ANA reporting on two loopback listeners (the second
/// inaccessible), namespace 1 (ANA group 5) with `UUID`, controller IDs
/// `cntlids`.
fn ana_target(cntlids: (u16, u16)) -> (pollux_nvmf::Target, SocketAddr, SocketAddr) {
    let t = start(ana_config(cntlids));
    let subs = t.subsystem_listeners();
    let ls = &subs[0].1;
    let (a, b) = (ls[0], ls[1]);
    (t, a, b)
}

/// [`ana_target`]'s configuration.
fn ana_config(cntlids: (u16, u16)) -> TargetConfig {
    let mut cfg = TargetConfig::default();
    cfg.bdevs.push(Bdev::ram("Malloc0", 512, 2048).unwrap());
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ids: NsIds {
            uuid: Some(UUID),
            ..Default::default()
        },
        anagrpid: 5,
    });
    let l1: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let l2: SocketAddr = "127.0.0.2:0".parse().unwrap();
    s.listeners = vec![l1, l2];
    s.ana_reporting = true;
    s.ana_states.push((l2, None, AnaState::Inaccessible));
    (s.min_cntlid, s.max_cntlid) = cntlids;
    cfg.subsystems.push(s);
    cfg
}

fn ana_log(c: &mut Client) -> AnaLog {
    let (d, cq) = c.data_cmd(Sqe::get_log_page(lid::ANA, 0, 4096, 0, 0, 0), 4096);
    assert!(cq.is_none_or(|c| c.status().is_success()));
    AnaLog::parse(&d).unwrap()
}

fn admin(addr: SocketAddr) -> (Client, u16) {
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    (a, cntlid)
}

#[test]
fn per_listener_states_events_and_io() {
    let (t, l1, l2) = ana_target((1, 0xFFEF));
    let (mut a1, c1) = admin(l1);
    let (mut a2, c2) = admin(l2);
    // Identify: ANA reporting, the namespace's group and identifiers.
    let (d, _) = a1.data_cmd(Sqe::identify(cns::CONTROLLER, 0, 0), 4096);
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_ne!(id.cmic & CMIC_ANA, 0);
    let (d, _) = a1.data_cmd(Sqe::identify(cns::NAMESPACE, 1, 0), 4096);
    let ns = IdentifyNamespace::read_from_bytes(&d).unwrap();
    assert_eq!((ns.anagrpid, ns.nguid, ns.nmic), (5, UUID, 1));

    // The ANA log per listener.
    let g1 = ana_log(&mut a1).groups;
    assert_eq!(
        (g1[0].anagrpid, g1[0].state, g1[0].nsids.clone()),
        (5, AnaState::Optimized, vec![1])
    );
    assert_eq!(ana_log(&mut a2).groups[0].state, AnaState::Inaccessible);

    // I/O: served through l1, refused through l2 with the path status.
    let mut q1 = Client::io_queue(l1, Digests::NONE, c1, 1, HOST_A, false);
    let mut q2 = Client::io_queue(l2, Digests::NONE, c2, 1, HOST_A, false);
    let data = pattern(4096, 9);
    assert!(q1.write(1, 0, &data, true).status().is_success());
    let st = q2.write(1, 0, &data, true).status();
    assert!(st.is(sct::PATH, path::ANA_INACCESSIBLE), "{st}");
    assert!(!st.dnr());

    // Live: l1 inaccessible, l2 optimized; each controller's held AER
    // completes with the ANA Change notice once.
    for a in [&mut a1, &mut a2] {
        let mut en = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 1 << 11);
        en.cid = a.next_cid();
        a.capsule(&en, &[]);
        assert!(a.resp().status().is_success());
    }
    let mut aer_sqe = Sqe::async_event_request();
    aer_sqe.cid = a1.next_cid();
    a1.capsule(&aer_sqe, &[]);
    let want = aer::encode(aer::NOTICE, aer::NOTICE_ANA_CHANGE, lid::ANA);
    t.set_ana_state(SUB1, l1, AnaState::Inaccessible, None)
        .unwrap();
    let ev = a1.resp();
    assert_eq!((ev.cid, ev.dw0), (aer_sqe.cid, want));
    // The same state again: no change, no event (the next AER stays held
    // until the following change).
    t.set_ana_state(SUB1, l1, AnaState::Inaccessible, None)
        .unwrap();
    assert_eq!(ana_log(&mut a1).groups[0].state, AnaState::Inaccessible);
    aer_sqe.cid = a1.next_cid();
    a1.capsule(&aer_sqe, &[]);
    t.set_ana_state(SUB1, l2, AnaState::Optimized, Some(5))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // The I/O queues follow at their next pass.
    let st = q1.write(1, 8, &data, true).status();
    assert!(st.is(sct::PATH, path::ANA_INACCESSIBLE), "{st}");
    assert!(q2.write(1, 8, &data, true).status().is_success());
    let (back, cq) = q2.read(1, 8, 4096);
    assert!(cq.is_none_or(|c| c.status().is_success()));
    assert_eq!(back, data);
    assert_eq!(ana_log(&mut a2).groups[0].state, AnaState::Optimized);
    t.set_ana_state(SUB1, l1, AnaState::NonOptimized, None)
        .unwrap();
    let ev = a1.resp();
    assert_eq!((ev.cid, ev.dw0), (aer_sqe.cid, want), "the second change");

    // Refusals name what is wrong.
    let e = t
        .set_ana_state(
            SUB1,
            "127.0.0.3:1".parse().unwrap(),
            AnaState::Optimized,
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not listen on 127.0.0.3:1"), "{e}");
    let e = t
        .set_ana_state(SUB1, l1, AnaState::Optimized, Some(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("anagrpid 0"), "{e}");
    // save_config says it again.
    let saved = serde_json::to_string(&t.save_config_nvmf()).unwrap();
    assert!(
        saved.contains("nvmf_subsystem_listener_set_ana_state"),
        "{saved}"
    );
    assert!(saved.contains("\"ana_state\":\"non_optimized\""), "{saved}");
    assert!(saved.contains("\"ana_reporting\":true"), "{saved}");
    assert!(
        saved.contains("6b1e0a51-2c4d-4e8f-9a01-112233445566"),
        "{saved}"
    );
}

#[test]
fn cntlid_range_is_honoured_and_exhausted() {
    let (_t, l1, l2) = ana_target((100, 101));
    let (_a, c1) = admin(l1);
    let (_b, c2) = admin(l2);
    let mut got = [c1, c2];
    got.sort_unstable();
    assert_eq!(got, [100, 101]);
    let mut c = Client::connect(l1);
    c.ic(Digests::NONE);
    let r = c.admin_connect(SUB1, HOST_A, 0);
    assert!(
        !r.status().is_success(),
        "a third controller in a range of two"
    );
}

#[test]
fn json_names_accepted_and_bad_values_named() {
    let doc = |extra_sub: &str, extra_ns: &str, extra_l: &str, more: &str| {
        format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[
              {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":2048,"block_size":512}}}}]}},
              {{"subsystem":"nvmf","config":[
              {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
              {{"method":"nvmf_create_subsystem","params":{{"nqn":"{SUB1}","allow_any_host":true{extra_sub}}}}},
              {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{SUB1}","namespace":{{"bdev_name":"Malloc0"{extra_ns}}}}}}},
              {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{SUB1}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}}{extra_l}}}}}{more}
              ]}}]}}"#
        )
    };
    let set = format!(
        r#",{{"method":"nvmf_subsystem_listener_set_ana_state","params":{{"nqn":"{SUB1}","listen_address":{{"trtype":"TCP","traddr":"127.0.0.1","trsvcid":"4420"}},"ana_state":"inaccessible","anagrpid":3}}}}"#
    );
    let c = TargetConfig::from_json(&doc(
        r#","ana_reporting":true,"min_cntlid":10,"max_cntlid":20"#,
        r#","uuid":"6b1e0a51-2c4d-4e8f-9a01-112233445566","nguid":"00112233445566778899aabbccddeeff","eui64":"0011223344556677","anagrpid":3"#,
        r#","ana_state":"non_optimized""#,
        &set,
    ))
    .unwrap();
    let s = &c.subsystems[0];
    assert!(s.ana_reporting);
    assert_eq!((s.min_cntlid, s.max_cntlid), (10, 20));
    let ns = &s.namespaces[0];
    assert_eq!(ns.ids.uuid, Some(UUID));
    assert_eq!(ns.ids.nguid.unwrap()[15], 0xff);
    assert_eq!(ns.ids.eui64.unwrap()[7], 0x77);
    assert_eq!(ns.anagrpid, 3);
    let l: SocketAddr = "127.0.0.1:4420".parse().unwrap();
    assert_eq!(
        s.ana_states,
        vec![
            (l, None, AnaState::NonOptimized),
            (l, Some(3), AnaState::Inaccessible)
        ]
    );
    for (sub, ns, lst, more, name) in [
        (
            r#","min_cntlid":30,"max_cntlid":20"#,
            "",
            "",
            "",
            "min_cntlid",
        ),
        (r#","max_cntlid":65520"#, "", "", "", "max_cntlid"),
        ("", r#","uuid":"not-a-uuid""#, "", "", "uuid"),
        ("", r#","nguid":"0011""#, "", "", "nguid"),
        ("", r#","eui64":"zz11223344556677""#, "", "", "eui64"),
        ("", r#","anagrpid":0"#, "", "", "anagrpid"),
        ("", "", r#","ana_state":"bogus""#, "", "ana_state"),
        (
            r#","ana_reporting":true"#,
            "",
            r#","ana_state":"persistent_loss""#,
            "",
            "ana_state",
        ),
        // ANA reporting off: no ANA state to set.
        ("", "", "", set.as_str(), "ANA reporting is off"),
    ] {
        let e = TargetConfig::from_json(&doc(sub, ns, lst, more))
            .unwrap_err()
            .to_string();
        assert!(e.contains(name), "{name}: {e}");
    }
}

/// A reload's plan made live (`Target::apply_reload`): the new ANA state
/// raises the ANA Change notice as `set_ana_state` does; a listener that
/// cannot be bound leaves its subsystem as it was (the host added with it
/// is not).
#[test]
fn a_reload_changes_ana_states_with_the_event_and_never_half_a_subsystem() {
    use pollux_nvmf::config::{plan, ConfigFile, LiveChange};
    let cfg = ana_config((1, 0xFFEF));
    let started = ConfigFile {
        target: cfg.clone(),
        bdevs: Vec::new(),
    };
    let t = start(cfg);
    let l1 = t.subsystem_listeners()[0].1[0];
    let (mut a1, _) = admin(l1);
    let mut en = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 1 << 11);
    en.cid = a1.next_cid();
    a1.capsule(&en, &[]);
    assert!(a1.resp().status().is_success());
    let mut aer_sqe = Sqe::async_event_request();
    aer_sqe.cid = a1.next_cid();
    a1.capsule(&aer_sqe, &[]);
    assert_eq!(ana_log(&mut a1).groups[0].state, AnaState::Optimized);

    // The file says: the first listener (asked for as port 0)
    // inaccessible.
    let mut new = started.clone();
    let s = &mut new.target.subsystems[0];
    let asked = s.listeners[0];
    s.ana_states.push((asked, None, AnaState::Inaccessible));
    let p = plan(&started, &new, &t.running());
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    let done = t.apply_reload(&p);
    assert!(done.failed.is_empty(), "{:?}", done.failed);
    assert_eq!(done.applied.len(), 1, "{:?}", done.applied);
    let ev = a1.resp();
    let want = aer::encode(aer::NOTICE, aer::NOTICE_ANA_CHANGE, lid::ANA);
    assert_eq!((ev.cid, ev.dw0), (aer_sqe.cid, want));
    assert_eq!(ana_log(&mut a1).groups[0].state, AnaState::Inaccessible);
    // The same file again: nothing to do.
    assert!(plan(&started, &new, &t.running()).is_empty());

    // A listener on a port taken, with a host: neither is made.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut bad = new.clone();
    let s = &mut bad.target.subsystems[0];
    s.listeners.push(taken.local_addr().unwrap());
    s.allow_any_host = false;
    s.hosts.push(HOST_B.into());
    let p = plan(&started, &bad, &t.running());
    assert_eq!(
        p.subsystems[0].changes[0],
        LiveChange::AddListener(taken.local_addr().unwrap())
    );
    let before = t.running();
    let done = t.apply_reload(&p);
    assert!(done.applied.is_empty(), "{:?}", done.applied);
    assert!(
        done.failed.len() == 1 && done.failed[0].contains("none of its changes made"),
        "{:?}",
        done.failed
    );
    assert_eq!(t.running(), before);
}
