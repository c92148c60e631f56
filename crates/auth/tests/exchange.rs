//! HostAuth against CtrlAuth: every hash and group, one-way and
//! bidirectional, wrong secrets on either side, negotiation failures, and
//! malformed messages.

use std::sync::Arc;

use pollux_auth::msg;
use pollux_auth::{
    AuthError, CtrlAuth, CtrlConfig, DhGroupId, DhchapKey, HashId, HostAuth, HostConfig, Secret,
};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const SUBNQN: &str = "nqn.2024-01.io.pollux:auth-test";

fn key(fill: u8, len: usize, h: Option<HashId>) -> DhchapKey {
    DhchapKey::from_raw(Secret::new(vec![fill; len]), h)
}

struct Setup {
    host: HostConfig,
    ctrl: CtrlConfig,
}

fn setup(bidi: bool) -> Setup {
    let hk = key(0x11, 32, Some(HashId::Sha256));
    let ck = key(0x22, 48, Some(HashId::Sha384));
    let mut host = HostConfig::new(HOSTNQN, SUBNQN, hk.clone());
    let mut ctrl = CtrlConfig::new(SUBNQN, HOSTNQN, hk);
    if bidi {
        host.ctrl_key = Some(ck.clone());
        ctrl.ctrl_key = Some(ck);
    }
    Setup { host, ctrl }
}

/// Run one transaction to its end; the error of the side that failed.
fn run(s: &Setup, t_id: u16) -> Result<(HashId, DhGroupId), AuthError> {
    let mut h = HostAuth::new(Arc::new(s.host.clone()), t_id);
    let mut c = CtrlAuth::new(Arc::new(s.ctrl.clone()));
    let neg = h.negotiate()?;
    let chal = c.negotiate(&neg)?;
    let reply = match h.challenge(&chal) {
        Ok(r) => r,
        Err(e) => {
            // The host aborts: the controller sees AUTH_Failure2.
            if let Some(f2) = h.failure2(&e) {
                assert!(matches!(c.reply(&f2), Err(AuthError::Failure2 { .. })));
            }
            return Err(e);
        }
    };
    let s1 = match c.reply(&reply) {
        Ok(s1) => s1,
        Err(e) => {
            let f1 = c.failure1(&e).expect("a failure1 to send");
            let he = h.success1(&f1).expect_err("host sees Failure1");
            assert!(matches!(he, AuthError::Failure1 { .. }), "{he}");
            assert!(h.failure2(&he).is_none(), "no Failure2 after a Failure1");
            return Err(e);
        }
    };
    match h.success1(&s1) {
        Ok(Some(s2)) => {
            assert!(c.awaits_success2());
            c.success2(&s2)?;
        }
        Ok(None) => assert!(!c.awaits_success2()),
        Err(e) => {
            let f2 = h.failure2(&e).expect("a failure2 to send");
            let ce = c.success2(&f2).expect_err("controller sees Failure2");
            assert!(
                matches!(ce, AuthError::Failure2 { explanation: 1, .. }),
                "{ce}"
            );
            return Err(e);
        }
    }
    assert!(h.is_done());
    assert!(c.is_done() && c.is_authenticated());
    assert_eq!(h.negotiated(), c.negotiated());
    Ok(h.negotiated().expect("negotiated"))
}

fn only(s: &mut Setup, h: HashId, g: DhGroupId) {
    s.ctrl.hashes = vec![h];
    s.ctrl.dhgroups = vec![g];
}

#[test]
fn every_hash_with_null_and_ffdhe2048_both_ways() {
    for bidi in [false, true] {
        for h in HashId::ALL {
            for g in [DhGroupId::Null, DhGroupId::Ffdhe2048] {
                let mut s = setup(bidi);
                only(&mut s, h, g);
                assert_eq!(run(&s, 3).expect("authenticates"), (h, g), "bidi {bidi}");
            }
        }
    }
}

#[test]
fn every_bigger_group_once() {
    for (i, g) in [
        DhGroupId::Ffdhe3072,
        DhGroupId::Ffdhe4096,
        DhGroupId::Ffdhe6144,
        DhGroupId::Ffdhe8192,
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = setup(i % 2 == 0);
        only(&mut s, HashId::ALL[i % 3], g);
        assert_eq!(run(&s, 9).expect("authenticates").1, g);
    }
}

#[test]
fn untransformed_and_longer_keys() {
    let mut s = setup(true);
    let hk = key(0x33, 64, None);
    s.host.key = hk.clone();
    s.ctrl.host_key = hk;
    let ck = key(0x44, 32, Some(HashId::Sha512));
    s.host.ctrl_key = Some(ck.clone());
    s.ctrl.ctrl_key = Some(ck);
    only(&mut s, HashId::Sha384, DhGroupId::Ffdhe2048);
    run(&s, 0xFFFF).expect("authenticates");
}

#[test]
fn wrong_host_secret_is_refused() {
    for g in [DhGroupId::Null, DhGroupId::Ffdhe2048] {
        let mut s = setup(false);
        only(&mut s, HashId::Sha256, g);
        s.host.key = key(0x12, 32, Some(HashId::Sha256));
        assert!(matches!(run(&s, 1), Err(AuthError::HostResponseMismatch)));
    }
    // Same bytes, another transformation: still wrong.
    let mut s = setup(false);
    s.host.key = key(0x11, 32, Some(HashId::Sha384));
    assert!(matches!(run(&s, 1), Err(AuthError::HostResponseMismatch)));
}

#[test]
fn wrong_controller_secret_is_refused_by_the_host() {
    for g in [DhGroupId::Null, DhGroupId::Ffdhe2048] {
        let mut s = setup(true);
        only(&mut s, HashId::Sha512, g);
        s.ctrl.ctrl_key = Some(key(0x23, 48, Some(HashId::Sha384)));
        let e = run(&s, 1).expect_err("refused");
        assert!(matches!(e, AuthError::ControllerResponseMismatch), "{e}");
        assert!(e.to_string().contains("controller"), "{e}");
    }
}

#[test]
fn controller_without_a_controller_secret_refuses_bidirectional() {
    let mut s = setup(true);
    s.ctrl.ctrl_key = None;
    assert!(matches!(run(&s, 1), Err(AuthError::NoControllerKey)));
}

#[test]
fn a_controller_that_skips_its_response_is_refused() {
    let s = setup(true);
    let mut h = HostAuth::new(Arc::new(s.host.clone()), 5);
    let mut c = CtrlAuth::new(Arc::new(s.ctrl.clone()));
    let chal = c.negotiate(&h.negotiate().expect("neg")).expect("chal");
    h.challenge(&chal).expect("reply");
    let (hash, _) = h.negotiated().expect("negotiated");
    let s1 = msg::encode_success1(5, hash.hash_len(), None);
    assert!(matches!(
        h.success1(&s1),
        Err(AuthError::MissingControllerResponse)
    ));
}

#[test]
fn negotiation_failures() {
    let mut s = setup(false);
    s.host.hashes = vec![HashId::Sha256];
    s.ctrl.hashes = vec![HashId::Sha512];
    assert!(matches!(run(&s, 1), Err(AuthError::NoCommonHash { .. })));
    let mut s = setup(false);
    s.host.dhgroups = vec![DhGroupId::Null];
    s.ctrl.dhgroups = vec![DhGroupId::Ffdhe2048];
    assert!(matches!(run(&s, 1), Err(AuthError::NoCommonDhGroup { .. })));
    // A controller that picks what the host did not offer.
    let s = setup(false);
    let mut h = HostAuth::new(
        Arc::new(HostConfig {
            hashes: vec![HashId::Sha256],
            ..s.host.clone()
        }),
        2,
    );
    h.negotiate().expect("neg");
    let chal = msg::encode_challenge(2, HashId::Sha512, DhGroupId::Null, 1, &[0; 64], &[]);
    assert!(matches!(
        h.challenge(&chal),
        Err(AuthError::HashUnusable(3))
    ));
    let mut h = HostAuth::new(
        Arc::new(HostConfig {
            dhgroups: vec![DhGroupId::Null],
            ..s.host.clone()
        }),
        2,
    );
    h.negotiate().expect("neg");
    let chal = msg::encode_challenge(
        2,
        HashId::Sha256,
        DhGroupId::Ffdhe2048,
        1,
        &[0; 32],
        &[2; 256],
    );
    let e = h.challenge(&chal).expect_err("refused");
    assert!(matches!(e, AuthError::DhGroupUnusable(1)));
    let f2 = h.failure2(&e).expect("failure2");
    assert_eq!(f2[1], 0xF0);
    assert_eq!(f2[7], 5, "DH group unusable");
}

fn host_awaiting_challenge() -> HostAuth {
    let s = setup(false);
    let mut h = HostAuth::new(Arc::new(s.host), 4);
    h.negotiate().expect("neg");
    h
}

#[test]
fn malformed_challenges_are_refused() {
    let good = msg::encode_challenge(
        4,
        HashId::Sha256,
        DhGroupId::Ffdhe2048,
        9,
        &[7; 32],
        &[2; 256],
    );
    host_awaiting_challenge()
        .challenge(&good)
        .expect("good one passes");
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..10].to_vec(), "shorter than"),
        (good[..16 + 32 + 100].to_vec(), "shorter than"),
        (vec![1u8; 5000], "longer than"),
        (
            msg::encode_challenge(5, HashId::Sha256, DhGroupId::Null, 9, &[7; 32], &[]),
            "transaction id",
        ),
        (
            msg::encode_challenge(4, HashId::Sha256, DhGroupId::Null, 0, &[7; 32], &[]),
            "sequence number",
        ),
        (
            msg::encode_challenge(4, HashId::Sha256, DhGroupId::Null, 9, &[7; 32], &[1]),
            "DHVLEN",
        ),
        (
            msg::encode_challenge(
                4,
                HashId::Sha256,
                DhGroupId::Ffdhe2048,
                9,
                &[7; 32],
                &[2; 257],
            ),
            "DHVLEN",
        ),
        (
            msg::encode_challenge(
                4,
                HashId::Sha256,
                DhGroupId::Ffdhe2048,
                9,
                &[7; 32],
                &[0xFF; 256],
            ),
            "out of range",
        ),
        (msg::encode_success2(4), "expected DH-HMAC-CHAP_Challenge"),
    ];
    let mut bad_hl = good.clone();
    bad_hl[6] = 48;
    cases.push((bad_hl, "HL"));
    let mut bad_hash = good.clone();
    bad_hash[8] = 9;
    cases.push((bad_hash, "hash function 0x09"));
    let mut bad_group = good.clone();
    bad_group[9] = 6;
    cases.push((bad_group, "DH group 0x06"));
    for (m, want) in cases {
        let mut h = host_awaiting_challenge();
        let e = h.challenge(&m).expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert!(h.failure2(&e).is_some(), "{e}");
        // A failed transaction takes nothing more.
        assert!(matches!(h.success1(&[]), Err(AuthError::WrongState { .. })));
    }
    // The controller refused: its reason comes through.
    let f1 = msg::encode_failure(pollux_auth::msg::FAILURE1, 4, 4);
    let e = host_awaiting_challenge()
        .challenge(&f1)
        .expect_err("failure1");
    assert!(e.to_string().contains("hash function not usable"), "{e}");
}

#[test]
fn malformed_negotiates_and_replies_are_refused() {
    let s = setup(false);
    let neg = msg::encode_negotiate(1, &HashId::ALL, &DhGroupId::ALL);
    let mut long = neg.clone();
    long.push(0);
    let mut napd0 = neg.clone();
    napd0[7] = 0;
    let mut not_dhchap = neg.clone();
    not_dhchap[8] = 2;
    let mut halen = neg.clone();
    halen[10] = 31;
    for (m, want) in [
        (neg[..40].to_vec(), "shorter than"),
        (long, "longer than"),
        (napd0, "no DH-HMAC-CHAP"),
        (not_dhchap, "no DH-HMAC-CHAP"),
        (halen, "HALEN"),
    ] {
        let mut c = CtrlAuth::new(Arc::new(s.ctrl.clone()));
        let e = c.negotiate(&m).expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
        assert!(c.failure1(&e).is_some());
    }
    // Replies: the controller expects exactly 16 + 2 HL + DHVLEN bytes.
    let mut sc = setup(false);
    only(&mut sc, HashId::Sha256, DhGroupId::Ffdhe2048);
    let fresh = || {
        let mut h = HostAuth::new(Arc::new(sc.host.clone()), 8);
        let mut c = CtrlAuth::new(Arc::new(sc.ctrl.clone()));
        let chal = c.negotiate(&h.negotiate().expect("neg")).expect("chal");
        let reply = h.challenge(&chal).expect("reply");
        (c, reply)
    };
    let (_, reply) = fresh();
    let mut long = reply.clone();
    long.push(0);
    let mut tid = reply.clone();
    tid[4] = 9;
    let mut cvalid = reply.clone();
    cvalid[8] = 2;
    let mut dh = reply.clone();
    let n = dh.len();
    dh[16 + 64..].fill(0);
    dh[n - 1] = 1;
    for (m, want) in [
        (reply[..20].to_vec(), "shorter than"),
        (long, "longer than"),
        (tid, "transaction id"),
        (cvalid, "CVALID"),
        (dh, "out of range"),
    ] {
        let (mut c, _) = fresh();
        let e = c.reply(&m).expect_err(want);
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
    let (mut c, reply) = fresh();
    c.reply(&reply).expect("the untouched reply passes");
}

/// `needs_dh`: a Negotiate that chooses an ffdhe group and the Reply of
/// such a transaction cost a modular exponentiation; the null group's
/// messages, a Success2, and anything out of turn do not.
#[test]
fn needs_dh_marks_the_messages_with_a_modular_exponentiation() {
    for (g, dh) in [(DhGroupId::Null, false), (DhGroupId::Ffdhe2048, true)] {
        let mut s = setup(true);
        only(&mut s, HashId::Sha256, g);
        let mut h = HostAuth::new(Arc::new(s.host.clone()), 5);
        let mut c = CtrlAuth::new(Arc::new(s.ctrl.clone()));
        let neg = h.negotiate().unwrap();
        assert_eq!(c.needs_dh(&neg), dh, "{g:?} Negotiate");
        assert!(!c.needs_dh(&[0xFF]), "a truncated message");
        let chal = c.negotiate(&neg).unwrap();
        let reply = h.challenge(&chal).unwrap();
        assert!(!c.needs_dh(&neg), "{g:?}: a Negotiate out of turn");
        assert_eq!(c.needs_dh(&reply), dh, "{g:?} Reply");
        let s1 = c.reply(&reply).unwrap();
        let s2 = h.success1(&s1).unwrap().expect("bidirectional");
        assert!(!c.needs_dh(&s2), "{g:?} Success2");
    }
    // A Negotiate offering no group the controller allows: no DH.
    let mut s = setup(false);
    only(&mut s, HashId::Sha256, DhGroupId::Ffdhe3072);
    let mut h = HostAuth::new(Arc::new(s.host.clone()), 6);
    let c = CtrlAuth::new(Arc::new(s.ctrl.clone()));
    let neg = h.negotiate().unwrap();
    let mut hs = s.host.clone();
    hs.dhgroups = vec![DhGroupId::Ffdhe2048];
    let mut h2 = HostAuth::new(Arc::new(hs), 6);
    assert!(c.needs_dh(&neg));
    assert!(!c.needs_dh(&h2.negotiate().unwrap()));
}
