//! The reload plan's tests (`reload.rs`).
use super::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a1";
const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000a2";

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A file of one subsystem (ANA reporting on) with `nvmf` entries
/// `extra` after its creation and its namespace on Malloc0.
fn file(bdev_blocks: u64, create: &str, extra: &[String]) -> ConfigFile {
    let mut nvmf = vec![
        r#"{"method": "nvmf_create_transport", "params": {"trtype": "TCP"}}"#.to_string(),
        format!(
            r#"{{"method": "nvmf_create_subsystem", "params": {{"nqn": "{NQN}", "ana_reporting": true{create}}}}}"#
        ),
        format!(
            r#"{{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{NQN}", "namespace": {{"bdev_name": "Malloc0"}}}}}}"#
        ),
    ];
    nvmf.extend(extra.iter().cloned());
    let json = format!(
        r#"{{"subsystems": [
          {{"subsystem": "bdev", "config": [{{"method": "bdev_malloc_create", "params": {{"name": "Malloc0", "num_blocks": {bdev_blocks}, "block_size": 512}}}}]}},
          {{"subsystem": "nvmf", "config": [{}]}}]}}"#,
        nvmf.join(",")
    );
    ConfigFile::parse(&json).expect("valid file")
}

fn listener(addr: &str, ana: Option<&str>) -> String {
    let (ip, port) = addr.rsplit_once(':').unwrap();
    let ana = ana.map_or(String::new(), |s| format!(r#", "ana_state": "{s}""#));
    format!(
        r#"{{"method": "nvmf_subsystem_add_listener", "params": {{"nqn": "{NQN}", "listen_address": {{"trtype": "TCP", "adrfam": "IPv4", "traddr": "{ip}", "trsvcid": "{port}"}}{ana}}}}}"#
    )
}

fn host(h: &str) -> String {
    format!(
        r#"{{"method": "nvmf_subsystem_add_host", "params": {{"nqn": "{NQN}", "host": "{h}"}}}}"#
    )
}

fn group_state(addr: &str, g: u32, st: &str) -> String {
    let (ip, port) = addr.rsplit_once(':').unwrap();
    format!(
        r#"{{"method": "nvmf_subsystem_listener_set_ana_state", "params": {{"nqn": "{NQN}", "listen_address": {{"trtype": "TCP", "traddr": "{ip}", "trsvcid": "{port}"}}, "ana_state": "{st}", "anagrpid": {g}}}}}"#
    )
}

/// The target as `f` starts it (listeners bound where asked).
fn running_of(f: &ConfigFile) -> Running {
    Running {
        subsystems: f
            .target
            .subsystems
            .iter()
            .map(|s| RunningSubsystem {
                nqn: s.nqn.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                listeners: s.listeners.iter().map(|&l| (l, l)).collect(),
                ana: s
                    .listeners
                    .iter()
                    .map(|&l| {
                        let (d, g) = file_ana(&s.ana_states, l);
                        (l, d, g.into_iter().collect())
                    })
                    .collect(),
            })
            .collect(),
        discovery: Vec::new(),
        sock_impl: f.target.transport.sock_impl,
    }
}

const L1: &str = "127.0.0.1:4421";
const L2: &str = "127.0.0.1:4422";

#[test]
fn the_same_file_changes_nothing() {
    let f = file(64, "", &[listener(L1, Some("optimized")), host(H1)]);
    assert!(plan(&f, &f, &running_of(&f)).is_empty());
}

#[test]
fn an_ana_state_change_is_applied_through_its_listener() {
    let old = file(
        64,
        "",
        &[listener(L1, Some("optimized")), listener(L2, None)],
    );
    let new = file(
        64,
        "",
        &[listener(L1, Some("inaccessible")), listener(L2, None)],
    );
    let p = plan(&old, &new, &running_of(&old));
    assert_eq!(p.not_applied, Vec::<String>::new());
    assert_eq!(
        p.subsystems,
        [SubsystemPlan {
            nqn: NQN.into(),
            changes: vec![LiveChange::SetAnaState {
                listener: a(L1),
                anagrpid: None,
                state: AnaState::Inaccessible
            }]
        }]
    );
    // Back again: the running state (changed over JSON-RPC, say) is
    // what is compared with the file.
    let p = plan(&old, &old, &running_of(&new));
    assert_eq!(
        p.subsystems[0].changes,
        [LiveChange::SetAnaState {
            listener: a(L1),
            anagrpid: None,
            state: AnaState::Optimized
        }]
    );
}

#[test]
fn ana_groups_change_one_by_one_unless_the_default_does() {
    let old = file(
        64,
        "",
        &[listener(L1, None), group_state(L1, 2, "inaccessible")],
    );
    let new = file(
        64,
        "",
        &[listener(L1, None), group_state(L1, 3, "non_optimized")],
    );
    let set = |g: Option<u32>, state| LiveChange::SetAnaState {
        listener: a(L1),
        anagrpid: g,
        state,
    };
    let p = plan(&old, &new, &running_of(&old));
    assert_eq!(
        p.subsystems[0].changes,
        [
            set(Some(2), AnaState::Optimized),
            set(Some(3), AnaState::NonOptimized)
        ]
    );
    let new = file(
        64,
        "",
        &[
            listener(L1, Some("non_optimized")),
            group_state(L1, 2, "inaccessible"),
        ],
    );
    let p = plan(&old, &new, &running_of(&old));
    assert_eq!(
        p.subsystems[0].changes,
        [
            set(None, AnaState::NonOptimized),
            set(Some(2), AnaState::Inaccessible)
        ]
    );
}

#[test]
fn listeners_and_hosts_are_applied_in_a_safe_order() {
    let old = file(64, "", &[listener(L1, None), host(H1)]);
    let new = file(64, "", &[listener(L2, Some("non_optimized")), host(H2)]);
    let p = plan(&old, &new, &running_of(&old));
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    assert_eq!(
        p.subsystems[0].changes,
        [
            LiveChange::AddListener(a(L2)),
            LiveChange::SetAnaState {
                listener: a(L2),
                anagrpid: None,
                state: AnaState::NonOptimized
            },
            LiveChange::AddHost {
                host: H2.into(),
                key: None,
                ctrlr_key: None
            },
            LiveChange::RemoveHost(H1.into()),
            LiveChange::RemoveListener(a(L1)),
        ]
    );
    let open = file(
        64,
        r#", "allow_any_host": true"#,
        &[listener(L1, None), host(H1)],
    );
    let p = plan(&old, &open, &running_of(&old));
    assert_eq!(p.subsystems[0].changes, [LiveChange::AllowAnyHost(true)]);
}

#[test]
fn the_discovery_subsystems_own_listeners() {
    let old = file(64, "", &[listener(L1, None)]);
    let mut new = old.clone();
    new.target.discovery_listeners.push(a("127.0.0.1:8009"));
    let mut run = running_of(&old);
    run.discovery
        .push((a("127.0.0.1:8010"), a("127.0.0.1:8010")));
    let p = plan(&old, &new, &run);
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    assert_eq!(
        p.subsystems,
        [SubsystemPlan {
            nqn: DISCOVERY_NQN.into(),
            changes: vec![
                LiveChange::AddListener(a("127.0.0.1:8009")),
                LiveChange::RemoveListener(a("127.0.0.1:8010"))
            ]
        }]
    );
}

#[test]
fn a_port_0_listener_is_the_one_bound_for_it() {
    let f = file(64, "", &[listener("127.0.0.1:0", Some("optimized"))]);
    let mut run = running_of(&f);
    let bound = a("127.0.0.1:40000");
    run.subsystems[0].listeners = vec![(a("127.0.0.1:0"), bound)];
    run.subsystems[0].ana = vec![(bound, AnaState::Optimized, Vec::new())];
    assert!(plan(&f, &f, &run).is_empty());
    let g = file(64, "", &[listener("127.0.0.1:0", Some("inaccessible"))]);
    assert_eq!(
        plan(&f, &g, &run).subsystems[0].changes,
        [LiveChange::SetAnaState {
            listener: bound,
            anagrpid: None,
            state: AnaState::Inaccessible
        }]
    );
}

/// A listener added by the file with SPDK's per-listener `sock_impl` is
/// added if it names the running target's implementation; naming
/// another, its subsystem is not changed and the reload says why (both
/// names), as a restart would refuse it.
#[test]
fn a_listeners_sock_impl_must_be_the_running_targets() {
    let with = |si: &str| {
        let (ip, port) = L2.rsplit_once(':').unwrap();
        format!(
            r#"{{"method": "nvmf_subsystem_add_listener", "params": {{"nqn": "{NQN}", "listen_address": {{"trtype": "TCP", "traddr": "{ip}", "trsvcid": "{port}"}}, "sock_impl": "{si}"}}}}"#
        )
    };
    let old = file(64, "", &[listener(L1, None)]);
    let run = running_of(&old);
    assert_eq!(run.sock_impl, SockImpl::Posix);
    let same = file(64, "", &[listener(L1, None), with("posix")]);
    let p = plan(&old, &same, &run);
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    assert_eq!(p.subsystems[0].changes, [LiveChange::AddListener(a(L2))]);
    let other = file(64, "", &[listener(L1, None), with("uring")]);
    let p = plan(&old, &other, &run);
    assert!(p.subsystems.is_empty(), "{:?}", p.subsystems);
    let w = &p.not_applied[..];
    assert!(
        w.len() == 1
            && w[0].contains(NQN)
            && w[0].contains(&format!(
                "listener {L2}: sock_impl 'uring' is not the target's 'posix'"
            ))
            && w[0].contains("not made either: listener"),
        "{w:?}"
    );
}

/// A subsystem with a change a reload cannot make gets none made,
/// and both are named.
#[test]
fn a_subsystem_is_never_half_changed() {
    let old = file(64, "", &[listener(L1, None)]);
    let new = file(
        64,
        r#", "serial_number": "SN2""#,
        &[listener(L1, Some("inaccessible"))],
    );
    let p = plan(&old, &new, &running_of(&old));
    assert!(p.subsystems.is_empty(), "{:?}", p.subsystems);
    assert_eq!(p.not_applied.len(), 1);
    let w = &p.not_applied[0];
    assert!(
        w.contains(NQN) && w.contains("serial_number changed") && w.contains("inaccessible"),
        "{w}"
    );
}

#[test]
fn what_a_reload_does_not_apply_is_named() {
    let old = file(64, "", &[listener(L1, None)]);
    // A bigger bdev: its namespace changes too.
    let p = plan(
        &old,
        &file(128, "", &[listener(L1, None)]),
        &running_of(&old),
    );
    assert!(p.subsystems.is_empty());
    assert_eq!(
        p.not_applied,
        [
            "bdev 'Malloc0' changed".to_string(),
            format!("subsystem '{NQN}': namespace 1 changed")
        ]
    );
    let two = format!(
        r#"{{"method": "nvmf_subsystem_add_ns", "params": {{"nqn": "{NQN}", "namespace": {{"bdev_name": "Malloc0", "nsid": 2}}}}}}"#
    );
    let p = plan(&old, &file(64, "", &[two]), &running_of(&old));
    assert_eq!(
        p.not_applied,
        [format!(
            "subsystem '{NQN}': namespace 2 added (so its live changes are not made either: listener {L1} removed)"
        )]
    );
    let p = plan(
        &old,
        &file(
            64,
            r#", "min_cntlid": 5, "ana_reporting": false"#,
            &[listener(L1, None)],
        ),
        &running_of(&old),
    );
    assert_eq!(
        p.not_applied,
        [format!(
            "subsystem '{NQN}': ana_reporting changed; min_cntlid/max_cntlid changed"
        )]
    );
    // Subsystems added or gone, the transport.
    let mut new = old.clone();
    new.target.subsystems[0].nqn = "nqn.2016-06.io.spdk:cnode2".into();
    new.target.transport.max_queue_depth = 64;
    let p = plan(&old, &new, &running_of(&old));
    assert_eq!(
        p.not_applied,
        [
            "the transport's options (nvmf_create_transport) changed".to_string(),
            "subsystem 'nqn.2016-06.io.spdk:cnode2' is new in the file".into(),
            format!("subsystem '{NQN}' is no longer in the file"),
        ]
    );
    // A subsystem deleted over JSON-RPC is not created again.
    let p = plan(&old, &old, &Running::default());
    assert_eq!(
        p.not_applied,
        [format!(
            "subsystem '{NQN}' is not running (deleted over JSON-RPC?)"
        )]
    );
}

/// A file the target cannot run is refused whole, naming the culprit,
/// and makes no bdev (a reload reads it so).
#[test]
fn a_bad_file_is_refused_and_an_nvme_namespace_is_known_by_name() {
    let e = ConfigFile::parse(r#"{"subsystems": [{"subsystem": "nvmf", "config": [
        {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:c1"}},
        {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:c1", "namespace": {"bdev_name": "Nope0"}}}]}]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Nope0") && e.contains("does not exist"), "{e}");
    let f = ConfigFile::parse(r#"{"subsystems": [
        {"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:00:04.0"}}]},
        {"subsystem": "nvmf", "config": [
        {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:c1"}},
        {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:c1", "namespace": {"bdev_name": "Nvme0n1"}}}]}]}"#)
        .expect("an NVMe controller's namespace");
    assert!(f.target.bdevs.is_empty());
    assert_eq!(f.bdevs.len(), 1);
}

/// Hosts with DH-HMAC-CHAP keys: added (with a key the target has) or
/// removed live; a kept host's keys changed, or a key the target did
/// not start with, are for a restart.
#[test]
fn hosts_with_keys() {
    use super::super::auth::{HostKeys, KeyFile};
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("pollux-reload-key-{}", std::process::id()));
    std::fs::write(
        &path,
        "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = |n: &str| KeyFile::load(n, &path).unwrap();
    let hk = |h: &str, k: &str, c: Option<&str>| HostKeys {
        host: h.into(),
        key: k.into(),
        ctrlr_key: c.map(Into::into),
    };
    let mut started = file(64, "", &[listener(L1, None), host(H1)]);
    started.target.keyring.add(key("key0")).unwrap();
    started.target.subsystems[0].host_keys = vec![hk(H1, "key0", None)];
    let run = running_of(&started);
    let mut gone = started.clone();
    gone.target.subsystems[0].hosts.clear();
    gone.target.subsystems[0].host_keys.clear();
    let p = plan(&started, &gone, &run);
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    assert_eq!(p.subsystems[0].changes, [LiveChange::RemoveHost(H1.into())]);
    let mut more = started.clone();
    more.target.subsystems[0].hosts.push(H2.into());
    more.target.subsystems[0]
        .host_keys
        .push(hk(H2, "key0", Some("key0")));
    let p = plan(&started, &more, &run);
    assert!(p.not_applied.is_empty(), "{:?}", p.not_applied);
    assert_eq!(
        p.subsystems[0].changes,
        [LiveChange::AddHost {
            host: H2.into(),
            key: Some("key0".into()),
            ctrlr_key: Some("key0".into())
        }]
    );
    let mut changed = started.clone();
    changed.target.subsystems[0].host_keys = vec![hk(H1, "key0", Some("key0"))];
    assert_eq!(
        plan(&started, &changed, &run).not_applied,
        [format!(
            "subsystem '{NQN}': host {H1}'s DH-HMAC-CHAP keys changed"
        )]
    );
    let mut new_key = more.clone();
    new_key.target.keyring.add(key("key1")).unwrap();
    new_key.target.subsystems[0].host_keys[1] = hk(H2, "key1", None);
    let p = plan(&started, &new_key, &run);
    let _ = std::fs::remove_file(&path);
    assert!(p.subsystems.is_empty());
    assert_eq!(
        p.not_applied,
        [
            "keyring: key 'key1' added".to_string(),
            format!("subsystem '{NQN}': host {H2} added with key 'key1', which the target did not start with (so its live changes are not made either: host {H2} added)")
        ]
    );
}
