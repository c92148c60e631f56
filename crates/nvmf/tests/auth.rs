//! DH-HMAC-CHAP on the target: a raw host (the test client of
//! `common`) runs the exchange with `pollux-auth`'s `HostAuth` against
//! the target's `CtrlAuth`: one-way and bidirectional, wrong secrets
//! refused and logged, commands before authentication refused with
//! Authentication Required on the admin and the I/O queue, the deadline,
//! re-authentication, and keys given live.
mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pattern, Client, Pdu, HOST_A, HOST_B, SUB1};
use pollux_auth::{AuthError, DhchapKey, HashId, HostAuth, HostConfig, Secret};
use pollux_bdev::Bdev;
use pollux_nvmf::{
    testing, AuthOptions, HostKeys, KeyFile, NamespaceConfig, SubsystemConfig, Target,
    TargetConfig, TransportOptions,
};
use pollux_spec::fabrics::PropertySize;
use pollux_spec::fabrics::{fabrics_sc, AuthCmd, SglDescriptor, AUTHREQ_ATR, CNTLID_DYNAMIC};
use pollux_spec::features::fid;
use pollux_spec::status::{generic, sct};
use pollux_spec::tcp::{Digests, H2CData};
use pollux_spec::{Cqe, Sqe};
use zerocopy::IntoBytes;

// ---------------------------------------------------------------------
// Log capture: every event of the process, as text.
// ---------------------------------------------------------------------

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
    });
}

/// The log lines that contain every one of `words`.
fn logged(words: &[&str]) -> Vec<String> {
    let text = String::from_utf8_lossy(&LOG.lock().unwrap()).to_string();
    text.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .map(str::to_string)
        .collect()
}

/// Waits (up to 5 s) for a log line with every one of `words`.
fn wait_logged(words: &[&str]) -> Vec<String> {
    for _ in 0..500 {
        let l = logged(words);
        if !l.is_empty() {
            return l;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no log line with {words:?}");
}

// ---------------------------------------------------------------------
// Keys and the target
// ---------------------------------------------------------------------

/// A DH-HMAC-CHAP key made of `seed` bytes, transformed with SHA-256 (as
/// `nvme gen-dhchap-key -m 1` makes them).
fn key(seed: u8) -> DhchapKey {
    DhchapKey::from_raw(Secret::new(vec![seed; 32]), Some(HashId::Sha256))
}

/// `k` in a key file of mode 0600 named `name` (in this test's directory).
fn key_file(name: &str, k: &DhchapKey) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pollux-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, k.to_dhhc1().as_bytes()).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A target whose subsystem `SUB1` (one RAM namespace) lets HOST_A in
/// with key `host` (and `ctrl`: bidirectional), and HOST_B without one.
fn target(tag: &str, host: &DhchapKey, ctrl: Option<&DhchapKey>, opts: TransportOptions) -> Target {
    target_with(tag, &[(HOST_A, host)], ctrl, opts, AuthOptions::default())
}

/// A target (one thread) whose subsystem `SUB1` (one RAM namespace) lets
/// HOST_A and HOST_B in, those of `hosts` with their keys (and `ctrl`:
/// bidirectional), with `auth`'s DH-HMAC-CHAP options.
fn target_with(
    tag: &str,
    hosts: &[(&str, &DhchapKey)],
    ctrl: Option<&DhchapKey>,
    opts: TransportOptions,
    auth: AuthOptions,
) -> Target {
    capture_logs();
    let mut cfg = TargetConfig {
        transport: opts,
        auth,
        ..Default::default()
    };
    if let Some(c) = ctrl {
        let ck = key_file(&format!("{tag}-ctrl.key"), c);
        cfg.keyring
            .add(KeyFile::load("ckey0", &ck).unwrap())
            .unwrap();
    }
    let mut host_keys = Vec::new();
    for (n, (h, k)) in hosts.iter().enumerate() {
        let name = format!("key{n}");
        let hk = key_file(&format!("{tag}-host{n}.key"), k);
        cfg.keyring.add(KeyFile::load(&name, &hk).unwrap()).unwrap();
        host_keys.push(HostKeys {
            host: h.to_string(),
            key: name,
            ctrlr_key: ctrl.map(|_| "ckey0".to_string()),
        });
    }
    cfg.bdevs.push(Bdev::ram("Malloc0", 512, 2048).unwrap());
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.allow_any_host = false;
    s.hosts = vec![HOST_A.into(), HOST_B.into()];
    s.host_keys = host_keys;
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    Target::start(cfg, &[0], Default::default()).unwrap()
}

// ---------------------------------------------------------------------
// The host's side of the exchange, over the test client
// ---------------------------------------------------------------------

fn auth_send(c: &mut Client, msg: &[u8]) -> Cqe {
    let mut sqe = AuthCmd::send(msg.len() as u32).to_sqe();
    sqe.cid = c.next_cid();
    c.capsule(&sqe, msg);
    c.resp()
}

/// An Authentication Send whose message goes through R2T/H2CData.
fn auth_send_r2t(c: &mut Client, msg: &[u8]) -> Cqe {
    let mut cmd = AuthCmd::send(msg.len() as u32);
    cmd.sgl1 = SglDescriptor::tcp_transport(msg.len() as u32);
    let mut sqe = cmd.to_sqe();
    sqe.cid = c.next_cid();
    c.capsule(&sqe, &[]);
    let Pdu::R2T { ttag, r2tl, .. } = c.recv() else {
        panic!("expected R2T");
    };
    assert_eq!(r2tl as usize, msg.len());
    let (h, l) = H2CData::new(sqe.cid, ttag, 0, msg.len() as u32, true, Digests::NONE, 0).unwrap();
    c.send_pdu(h.as_bytes(), &l, msg);
    c.resp()
}

fn auth_recv(c: &mut Client) -> Vec<u8> {
    let sqe = AuthCmd::receive(4096, SglDescriptor::tcp_transport(4096)).to_sqe();
    let (data, cqe) = c.data_cmd(sqe, 4096);
    if let Some(cqe) = cqe {
        assert!(cqe.status().is_success(), "Authentication Receive: {cqe:?}");
    }
    data
}

/// Runs the host's side of DH-HMAC-CHAP on `c`; `r2t`: the Reply goes
/// through R2T. The host's error if it refused (or was refused).
fn authenticate(
    c: &mut Client,
    host: &str,
    key: &DhchapKey,
    ctrl: Option<&DhchapKey>,
    r2t: bool,
) -> Result<(), AuthError> {
    let mut cfg = HostConfig::new(host, SUB1, key.clone());
    cfg.ctrl_key = ctrl.cloned();
    let mut h = HostAuth::new(Arc::new(cfg), 7);
    let ok = |r: Cqe| assert!(r.status().is_success(), "Authentication Send: {r:?}");
    ok(auth_send(c, &h.negotiate()?));
    let reply = h.challenge(&auth_recv(c))?;
    ok(if r2t {
        auth_send_r2t(c, &reply)
    } else {
        auth_send(c, &reply)
    });
    match h.success1(&auth_recv(c)) {
        Ok(Some(s2)) => ok(auth_send(c, &s2)),
        Ok(None) => {}
        Err(e) => {
            if let Some(f2) = h.failure2(&e) {
                ok(auth_send(c, &f2));
            }
            return Err(e);
        }
    }
    Ok(())
}

fn auth_required(r: &Cqe) -> bool {
    r.status()
        .is(sct::COMMAND_SPECIFIC, fabrics_sc::AUTHENTICATION_REQUIRED)
        && r.status().dnr()
}

/// An admin queue's Connect for `host`: the response (ATR checked by the
/// callers).
fn admin(addr: SocketAddr, host: &str) -> (Client, Cqe) {
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let r = c.connect_cmd(0, 31, 0, CNTLID_DYNAMIC, SUB1, host, false);
    assert!(r.status().is_success(), "Connect: {r:?}");
    (c, r)
}

fn atr(r: &Cqe) -> bool {
    (r.dw0 >> 16) as u16 & AUTHREQ_ATR != 0
}

/// CC.EN = 1, CSTS.RDY, one I/O queue granted.
fn enable(a: &mut Client) {
    let cc = pollux_spec::regs::Cc::standard(0).with_en(true);
    assert!(a.prop_set(0x14, cc.0 as u64).status().is_success());
    assert_eq!(a.prop_get(0x1C, PropertySize::Four).dw0 & 1, 1, "CSTS.RDY");
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
}

fn io_connect(addr: SocketAddr, cntlid: u16, host: &str) -> (Client, Cqe) {
    let mut q = Client::connect(addr);
    q.ic(Digests::NONE);
    let r = q.connect_cmd(1, 63, 0, cntlid, SUB1, host, false);
    assert!(r.status().is_success(), "I/O Connect: {r:?}");
    (q, r)
}

fn check_io(q: &mut Client, seed: u8) {
    let d = pattern(4096, seed);
    assert!(q.write(1, 8, &d, true).status().is_success());
    assert_eq!(q.read(1, 8, 4096).0, d);
}

// ---------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------

/// One-way: the admin and the I/O queue each refuse commands with
/// Authentication Required until the host authenticates on it, then
/// serve it; a host without a key is not asked to authenticate.
#[test]
fn one_way_authentication_gates_admin_and_io_queues() {
    let k = key(1);
    let t = target("oneway", &k, None, Default::default());
    let addr = t.listen_addrs()[0];

    let (mut a, r) = admin(addr, HOST_A);
    assert!(atr(&r), "Connect of a host with a key: AUTHREQ.ATR {r:?}");
    let cntlid = r.dw0 as u16;
    // Before authentication: Property Get (fabrics), Identify (admin).
    let r = a.prop_get(0x1C, PropertySize::Four);
    assert!(
        auth_required(&r),
        "Property Get before authentication: {r:?}"
    );
    let mut id = Sqe::identify(1, 0, 0);
    id.cid = a.next_cid();
    let (_, r) = a.data_cmd(id, 4096);
    assert!(
        auth_required(&r.expect("a status")),
        "Identify before authentication"
    );
    authenticate(&mut a, HOST_A, &k, None, false).unwrap();
    enable(&mut a);

    // The I/O queue: its own exchange (its Reply through R2T).
    let (mut q, r) = io_connect(addr, cntlid, HOST_A);
    assert!(atr(&r), "I/O Connect: AUTHREQ.ATR {r:?}");
    let d = pattern(4096, 9);
    let r = q.write(1, 8, &d, true);
    assert!(auth_required(&r), "a write before authentication: {r:?}");
    let (_, r) = q.read(1, 8, 4096);
    assert!(
        auth_required(&r.expect("a status")),
        "a read before authentication"
    );
    authenticate(&mut q, HOST_A, &k, None, true).unwrap();
    check_io(&mut q, 2);
    wait_logged(&["host authenticated", HOST_A, "qid=1"]);

    // A host without a key: no ATR, served at once.
    let (mut b, r) = admin(addr, HOST_B);
    assert!(!atr(&r), "{r:?}");
    enable(&mut b);
}

/// Bidirectional: the controller proves its secret too (Success1 carries
/// its response, the host's Success2 opens the gate).
#[test]
fn bidirectional_authentication() {
    let (k, ck) = (key(2), key(3));
    let t = target("bidi", &k, Some(&ck), Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, r) = admin(addr, HOST_A);
    assert!(atr(&r));
    let cntlid = r.dw0 as u16;
    authenticate(&mut a, HOST_A, &k, Some(&ck), false).unwrap();
    enable(&mut a);
    let (mut q, _) = io_connect(addr, cntlid, HOST_A);
    authenticate(&mut q, HOST_A, &k, Some(&ck), false).unwrap();
    check_io(&mut q, 3);
}

/// A wrong host secret: AUTH_Failure1, the connection closed, and a
/// WARN naming the peer and the host NQN (never the key).
#[test]
fn a_wrong_host_secret_is_refused_and_logged() {
    let t = target("wrong", &key(4), None, Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, _) = admin(addr, HOST_A);
    let peer = a.s.local_addr().unwrap().to_string();
    match authenticate(&mut a, HOST_A, &key(5), None, false) {
        Err(AuthError::Failure1 { .. }) => {}
        r => panic!("a wrong secret: {r:?}"),
    }
    a.expect_eof();
    let l = wait_logged(&["WARN", "authentication failed", &peer, HOST_A]);
    assert!(l[0].contains("wrong host secret"), "{l:?}");
    assert!(!l[0].contains(&*key(4).to_dhhc1()), "{l:?}");
    assert_eq!(t.subsystem_controllers(SUB1).unwrap().len(), 0);
}

/// Bidirectional with a wrong controller secret: the host refuses the
/// controller (AUTH_Failure2), the target closes the controller.
#[test]
fn a_wrong_controller_secret_is_refused_by_the_host() {
    let t = target("wrongctrl", &key(6), Some(&key(7)), Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, _) = admin(addr, HOST_A);
    let peer = a.s.local_addr().unwrap().to_string();
    match authenticate(&mut a, HOST_A, &key(6), Some(&key(8)), false) {
        Err(AuthError::ControllerResponseMismatch) => {}
        r => panic!("a wrong controller secret: {r:?}"),
    }
    a.expect_eof();
    wait_logged(&["WARN", "authentication failed", &peer, HOST_A]);
}

/// A failed authentication on an I/O queue takes the controller down:
/// its admin queue closes too (as Linux's fatal error).
#[test]
fn a_failed_io_queue_closes_its_controller() {
    let k = key(9);
    let t = target("iofail", &k, None, Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, r) = admin(addr, HOST_A);
    let cntlid = r.dw0 as u16;
    authenticate(&mut a, HOST_A, &k, None, false).unwrap();
    enable(&mut a);
    let (mut q, _) = io_connect(addr, cntlid, HOST_A);
    assert!(authenticate(&mut q, HOST_A, &key(10), None, false).is_err());
    q.expect_eof();
    a.expect_eof();
}

/// A host that never authenticates is closed after `auth_timeout`.
#[test]
fn an_exchange_not_done_in_time_closes_the_connection() {
    let o = TransportOptions {
        auth_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let t = target("deadline", &key(11), None, o);
    let addr = t.listen_addrs()[0];
    let (mut a, _) = admin(addr, HOST_A);
    let peer = a.s.local_addr().unwrap().to_string();
    let start = std::time::Instant::now();
    a.expect_eof();
    assert!(start.elapsed() < Duration::from_secs(5));
    wait_logged(&["WARN", "not done in time", &peer, HOST_A]);
    assert_eq!(t.subsystem_controllers(SUB1).unwrap().len(), 0);
}

/// A new AUTH_Negotiate on an authenticated queue re-authenticates; a
/// wrong secret then closes the controller.
#[test]
fn reauthentication() {
    let k = key(12);
    let t = target("reauth", &k, None, Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, r) = admin(addr, HOST_A);
    let cntlid = r.dw0 as u16;
    authenticate(&mut a, HOST_A, &k, None, false).unwrap();
    enable(&mut a);
    let (mut q, _) = io_connect(addr, cntlid, HOST_A);
    authenticate(&mut q, HOST_A, &k, None, false).unwrap();
    check_io(&mut q, 4);
    authenticate(&mut q, HOST_A, &k, None, false).unwrap();
    wait_logged(&["re-authentication asked", HOST_A]);
    check_io(&mut q, 5);
    authenticate(&mut a, HOST_A, &k, None, false).unwrap();
    assert!(a.prop_get(0x1C, PropertySize::Four).status().is_success());
    // Re-authentication with a wrong secret: the controller goes.
    assert!(authenticate(&mut q, HOST_A, &key(13), None, false).is_err());
    q.expect_eof();
    a.expect_eof();
}

/// Keys given live (`Target::add_key`, `add_host_with_keys`, as the
/// JSON-RPC methods do) apply to the next Connect; the listing shows key
/// names, never keys.
#[test]
fn keys_given_live() {
    capture_logs();
    let mut cfg = TargetConfig::default();
    cfg.bdevs.push(Bdev::ram("Malloc0", 512, 2048).unwrap());
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    let t = Target::start(cfg, &[0], Default::default()).unwrap();
    let addr = t.listen_addrs()[0];
    let (k, ck) = (key(14), key(15));
    t.add_key("k1", &key_file("live-host.key", &k)).unwrap();
    t.add_key("c1", &key_file("live-ctrl.key", &ck)).unwrap();
    let e = t.add_key("k1", &key_file("live-host.key", &k)).unwrap_err();
    assert!(e.to_string().contains("already"), "{e}");
    let e = t
        .add_host_with_keys(SUB1, HOST_A, Some("nokey"), None)
        .unwrap_err();
    assert!(e.to_string().contains("no key 'nokey'"), "{e}");
    t.add_host_with_keys(SUB1, HOST_A, Some("k1"), Some("c1"))
        .unwrap();
    let subs = serde_json::to_string(&t.subsystems()).unwrap();
    assert!(subs.contains(r#""dhchap_key":"k1""#), "{subs}");
    assert!(subs.contains(r#""dhchap_ctrlr_key":"c1""#), "{subs}");
    assert!(!subs.contains("DHHC-1"), "{subs}");
    let saved = serde_json::to_string(&t.save_config_nvmf()).unwrap();
    assert!(saved.contains(r#""dhchap_key":"k1""#), "{saved}");
    let keys = serde_json::to_string(&t.save_config_keyring()).unwrap();
    assert!(
        keys.contains("keyring_file_add_key") && keys.contains("live-host.key"),
        "{keys}"
    );
    assert!(!keys.contains("DHHC-1"), "{keys}");

    let (mut a, r) = admin(addr, HOST_A);
    assert!(atr(&r));
    assert!(auth_required(&a.prop_get(0x1C, PropertySize::Four)));
    authenticate(&mut a, HOST_A, &k, Some(&ck), false).unwrap();
    enable(&mut a);
}

/// Authentication Send with the wrong protocol is an invalid field; on a
/// queue of a host without a key, the exchange is out of sequence.
#[test]
fn malformed_authentication_commands() {
    let k = key(16);
    let t = target("malformed", &k, None, Default::default());
    let addr = t.listen_addrs()[0];
    let (mut a, _) = admin(addr, HOST_A);
    let mut cmd = AuthCmd::send(4);
    cmd.secp = 0xEA;
    let mut sqe = cmd.to_sqe();
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[0; 4]);
    assert!(a.resp().status().is(sct::GENERIC, generic::INVALID_FIELD));
    let (mut b, _) = admin(addr, HOST_B);
    let r = auth_send(&mut b, &[0; 8]);
    assert!(
        r.status().is(sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR),
        "{r:?}"
    );
}

// ---------------------------------------------------------------------
// The DH worker pool: Diffie-Hellman off the reactor thread
// ---------------------------------------------------------------------

/// Waits (up to 20 s) until `f` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not reached: {what}");
}

/// Sends HOST_A's AUTH_Negotiate (transaction `t_id`) on `c` without
/// waiting for its completion; the host's side, to go on with.
fn negotiate_only(c: &mut Client, host: &str, k: &DhchapKey, t_id: u16) -> HostAuth {
    let cfg = HostConfig::new(host, SUB1, k.clone());
    let mut h = HostAuth::new(Arc::new(cfg), t_id);
    let n = h.negotiate().unwrap();
    let mut sqe = AuthCmd::send(n.len() as u32).to_sqe();
    sqe.cid = c.next_cid();
    c.capsule(&sqe, &n);
    h
}

/// The rest of an exchange whose Negotiate `negotiate_only` sent.
fn finish_exchange(c: &mut Client, mut h: HostAuth) -> Result<(), AuthError> {
    let r = c.resp();
    assert!(r.status().is_success(), "Authentication Send: {r:?}");
    let reply = h.challenge(&auth_recv(c))?;
    assert!(auth_send(c, &reply).status().is_success());
    h.success1(&auth_recv(c)).map(|_| ())
}

/// While a queue's DH work is held at the worker, another connection on
/// the same (only) reactor thread connects and does I/O; then the held
/// exchange completes. (With the DH done inline on the reactor, as
/// before the pool, the other connection waits for the hold: its Connect
/// times out.)
#[test]
fn dh_work_does_not_hold_the_reactor() {
    let k = key(20);
    let t = target("dhpool", &k, None, Default::default());
    let addr = t.listen_addrs()[0];
    testing::hold_dh(&t, true);
    let (mut a, _) = admin(addr, HOST_A);
    let h = negotiate_only(&mut a, HOST_A, &k, 3);
    wait_until("the Negotiate's key pair held at the worker", || {
        testing::dh_jobs(&t) == (0, 1)
    });

    // HOST_B (no key) on the same thread meanwhile: Connect, enable, an
    // I/O queue, a write and a read.
    let (mut b, r) = admin(addr, HOST_B);
    let cntlid = r.dw0 as u16;
    enable(&mut b);
    let (mut q, _) = io_connect(addr, cntlid, HOST_B);
    check_io(&mut q, 21);
    assert_eq!(testing::dh_jobs(&t), (0, 1), "the job is still held");

    testing::hold_dh(&t, false);
    finish_exchange(&mut a, h).unwrap();
    enable(&mut a);
    let l = wait_logged(&["host authenticated", HOST_A, "reactor_us="]);
    println!("{}", l[0]);
    wait_until("the pool empty", || testing::dh_jobs(&t) == (0, 0));
}

/// A host beyond `dh_queue_per_host` gets AUTH_Failure1 ("authentication
/// failed") and a WARN naming its peer and NQN (never a key), while
/// another host's exchange, queued meanwhile, succeeds.
#[test]
fn a_host_over_its_dh_share_is_refused_another_is_served() {
    let (ka, kb) = (key(22), key(23));
    let auth = AuthOptions {
        dh_queue_per_host: 1,
        ..Default::default()
    };
    let t = target_with(
        "dhshare",
        &[(HOST_A, &ka), (HOST_B, &kb)],
        None,
        Default::default(),
        auth,
    );
    let addr = t.listen_addrs()[0];
    testing::hold_dh(&t, true);
    let (mut a1, _) = admin(addr, HOST_A);
    let h1 = negotiate_only(&mut a1, HOST_A, &ka, 1);
    wait_until("HOST_A's first job held", || testing::dh_jobs(&t) == (0, 1));

    // HOST_A's second exchange: over its share.
    let (mut a2, _) = admin(addr, HOST_A);
    let peer = a2.s.local_addr().unwrap().to_string();
    let mut h2 = HostAuth::new(Arc::new(HostConfig::new(HOST_A, SUB1, ka.clone())), 2);
    assert!(auth_send(&mut a2, &h2.negotiate().unwrap())
        .status()
        .is_success());
    let f1 = auth_recv(&mut a2);
    match h2.challenge(&f1) {
        Err(AuthError::Failure1 {
            reason: 1,
            explanation: 1,
        }) => {}
        r => panic!("over the share: {r:?}"),
    }
    assert_eq!(&f1[4..6], &2u16.to_le_bytes(), "the host's T_ID");
    a2.expect_eof();
    let l = wait_logged(&["WARN", "DH-HMAC-CHAP exchange refused", &peer, HOST_A]);
    assert!(l[0].contains("dhchap_dh_queue_per_host"), "{l:?}");
    assert!(!l[0].contains("DHHC-1"), "{l:?}");

    // HOST_B's exchange is taken meanwhile (its own share), and both
    // complete once the worker goes on.
    let (mut b, _) = admin(addr, HOST_B);
    let hb = negotiate_only(&mut b, HOST_B, &kb, 4);
    wait_until("HOST_B's job queued", || testing::dh_jobs(&t) == (1, 1));
    testing::hold_dh(&t, false);
    finish_exchange(&mut a1, h1).unwrap();
    finish_exchange(&mut b, hb).unwrap();
    enable(&mut a1);
    enable(&mut b);
    wait_until("the pool empty", || testing::dh_jobs(&t) == (0, 0));
}

/// A connection that goes away while its job is at the worker (closed by
/// the host, or by `auth_timeout`) leaves nothing behind: the job is
/// dropped, the pool's counts go back to zero, the host's share is free
/// again (one job per host here) and the thread serves on.
#[test]
fn a_connection_gone_while_its_dh_job_runs_leaves_nothing() {
    let k = key(24);
    let auth = AuthOptions {
        dh_queue_per_host: 1,
        ..Default::default()
    };
    let o = TransportOptions {
        auth_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let t = target_with("dhgone", &[(HOST_A, &k)], None, o, auth);
    let addr = t.listen_addrs()[0];

    // Closed by the host.
    testing::hold_dh(&t, true);
    let (mut a, _) = admin(addr, HOST_A);
    let _h = negotiate_only(&mut a, HOST_A, &k, 1);
    wait_until("the job held", || testing::dh_jobs(&t) == (0, 1));
    drop(a);
    wait_until("the controller gone", || t.controllers() == 0);
    testing::hold_dh(&t, false);
    wait_until("the pool empty", || testing::dh_jobs(&t) == (0, 0));

    // Closed by auth_timeout while the job is held.
    testing::hold_dh(&t, true);
    let (mut a, _) = admin(addr, HOST_A);
    let peer = a.s.local_addr().unwrap().to_string();
    let _h = negotiate_only(&mut a, HOST_A, &k, 2);
    wait_until("the job held", || testing::dh_jobs(&t) == (0, 1));
    a.expect_eof();
    wait_logged(&["WARN", "not done in time", &peer, HOST_A]);
    testing::hold_dh(&t, false);
    wait_until("the pool empty", || testing::dh_jobs(&t) == (0, 0));
    assert_eq!(t.controllers(), 0);

    // The host's share is free: a new exchange succeeds.
    let (mut a, _) = admin(addr, HOST_A);
    authenticate(&mut a, HOST_A, &k, None, false).unwrap();
    enable(&mut a);
}
