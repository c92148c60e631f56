//! DH-HMAC-CHAP after Connect, against the scripted controller running
//! `pollux_auth::CtrlAuth`: admin and I/O queues, one-way and
//! bidirectional, wrong secrets on either side, a controller that asks
//! when the host has no key, and authentication again on reconnect.
use pollux_auth::{AuthError, DhGroupId, DhchapKey, HashId, Secret};

use super::*;
use crate::fabrics::{AuthFailure, AuthOptions};

fn key(fill: u8) -> DhchapKey {
    DhchapKey::from_raw(Secret::new(vec![fill; 32]), Some(HashId::Sha256))
}

/// The controller knows host key 0x11 and controller key 0x22, prefers
/// ffdhe2048 (cheap in debug builds), and requires authentication.
fn controller(f: &Scripted, ctrl_key: bool) {
    let mut cfg = CtrlConfig::new(SUBNQN, HOSTNQN, key(0x11));
    cfg.ctrl_key = ctrl_key.then(|| key(0x22));
    let mut c = f.ctl();
    c.auth = Some(Arc::new(cfg));
    c.atr = true;
}

fn with_keys(host: u8, ctrl: Option<u8>) -> FabricsOptions {
    FabricsOptions {
        auth: AuthOptions {
            key: Some(key(host)),
            ctrl_key: ctrl.map(key),
            ..AuthOptions::default()
        },
        ..opts()
    }
}

fn auth_failure(e: Error) -> Box<crate::fabrics::AuthFailed> {
    match e {
        Error::Auth(a) => a,
        o => panic!("expected an authentication error, got {o}"),
    }
}

#[test]
fn one_way_on_the_admin_queue_and_every_io_queue() {
    let f = Scripted::default();
    controller(&f, false);
    let l = link(&f, with_keys(0x11, None));
    l.connect_queue(1, 128, l.cntlid(), 127).unwrap();
    l.connect_queue(2, 128, l.cntlid(), 127).unwrap();
    assert_eq!(f.ctl().auths, vec![(0, true), (1, true), (2, true)]);
}

#[test]
fn bidirectional_on_every_queue() {
    let f = Scripted::default();
    controller(&f, true);
    let l = link(&f, with_keys(0x11, Some(0x22)));
    l.connect_queue(1, 128, l.cntlid(), 127).unwrap();
    assert_eq!(f.ctl().auths, vec![(0, true), (1, true)]);
}

#[test]
fn restricted_digests_and_groups_are_what_is_negotiated() {
    let f = Scripted::default();
    controller(&f, false);
    let mut o = with_keys(0x11, None);
    o.auth.digests = vec![HashId::Sha384];
    o.auth.dhgroups = vec![DhGroupId::Null];
    link(&f, o);
    assert_eq!(f.ctl().auths, vec![(0, true)]);
    // Nothing in common: the controller answers AUTH_Failure1.
    let f = Scripted::default();
    controller(&f, false);
    {
        let mut c = f.ctl();
        let mut cfg = (**c.auth.as_ref().unwrap()).clone();
        cfg.hashes = vec![HashId::Sha512];
        c.auth = Some(Arc::new(cfg));
    }
    let mut o = with_keys(0x11, None);
    o.auth.digests = vec![HashId::Sha256];
    let e = auth_failure(AdminLink::connect(f.clone(), o).err().expect("refused"));
    assert!(e.to_string().contains("hash function not usable"), "{e}");
}

#[test]
fn a_wrong_host_secret_is_refused_with_the_controllers_reason() {
    let f = Scripted::default();
    controller(&f, false);
    let e = AdminLink::connect(f.clone(), with_keys(0x12, None))
        .err()
        .expect("refused");
    let a = auth_failure(e);
    assert!(matches!(
        a.failure,
        AuthFailure::Protocol(AuthError::Failure1 { explanation: 1, .. })
    ));
    let s = a.to_string();
    assert!(
        s.contains("AUTH_Failure1") && s.contains("authentication failed"),
        "{s}"
    );
    assert!(s.contains(SUBNQN) && s.contains("queue 0"), "{s}");
    assert!(!a.controller_rejected());
    assert_eq!(f.ctl().auths, vec![(0, false)]);
}

#[test]
fn a_controller_with_a_wrong_controller_secret_is_refused() {
    let f = Scripted::default();
    controller(&f, true);
    let e = AdminLink::connect(f.clone(), with_keys(0x11, Some(0x23)))
        .err()
        .expect("refused");
    let a = auth_failure(e);
    assert!(a.controller_rejected(), "{a}");
    let s = a.to_string();
    assert!(
        s.contains("controller 1 of") && s.contains("wrong controller secret"),
        "{s}"
    );
    // The host told the controller (AUTH_Failure2).
    assert_eq!(f.ctl().auths, vec![(0, false)]);
}

#[test]
fn a_controller_that_asks_when_the_host_has_no_key_is_an_error_saying_so() {
    let f = Scripted::default();
    controller(&f, false);
    let a = auth_failure(
        AdminLink::connect(f.clone(), opts())
            .err()
            .expect("refused"),
    );
    assert!(matches!(a.failure, AuthFailure::KeyMissing));
    assert!(
        a.to_string().contains("no DH-HMAC-CHAP key is configured"),
        "{a}"
    );
    assert!(f.ctl().auths.is_empty());
}

#[test]
fn a_host_with_a_key_authenticates_even_unasked() {
    let f = Scripted::default();
    controller(&f, false);
    f.ctl().atr = false;
    link(&f, with_keys(0x11, None));
    assert_eq!(f.ctl().auths, vec![(0, true)]);
    // No key, not asked: no authentication.
    let f = Scripted::default();
    controller(&f, false);
    f.ctl().atr = false;
    link(&f, opts());
    assert!(f.ctl().auths.is_empty());
}

#[test]
fn a_controller_without_authentication_refuses_the_commands() {
    let f = Scripted::default();
    let a = auth_failure(
        AdminLink::connect(f.clone(), with_keys(0x11, None))
            .err()
            .expect("refused"),
    );
    assert!(
        matches!(
            a.failure,
            AuthFailure::Command {
                cmd: "Authentication Send",
                ..
            }
        ),
        "{a}"
    );
}

#[test]
fn a_reconnect_authenticates_again() {
    let f = Scripted::default();
    controller(&f, true);
    let o = FabricsOptions {
        ctrl_loss_tmo: Some(Duration::from_millis(40)),
        ..with_keys(0x11, Some(0x22))
    };
    let l = link(&f, o);
    lose(&f, &l);
    l.ensure().unwrap();
    assert_eq!(f.ctl().auths, vec![(0, true), (0, true)]);
    // The controller no longer accepts the host's secret: every attempt
    // fails its authentication, and the reconnect gives up.
    lose(&f, &l);
    {
        let mut c = f.ctl();
        let mut cfg = (**c.auth.as_ref().unwrap()).clone();
        cfg.host_key = key(0x99);
        c.auth = Some(Arc::new(cfg));
    }
    let e = l.ensure().unwrap_err();
    assert!(e.to_string().contains("ctrl_loss_tmo"), "{e}");
    let auths = f.ctl().auths.clone();
    assert!(
        auths.len() > 2 && auths[2..].iter().all(|&(q, ok)| q == 0 && !ok),
        "{auths:?}"
    );
}
