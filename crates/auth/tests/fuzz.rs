//! Arbitrary bytes never make either state machine panic, at any step.

use std::sync::Arc;

use pollux_auth::{
    CtrlAuth, CtrlConfig, DhGroupId, DhchapKey, HashId, HostAuth, HostConfig, Secret,
};
use proptest::prelude::*;

fn configs() -> (HostConfig, CtrlConfig) {
    let k = DhchapKey::from_raw(Secret::new(vec![5; 32]), Some(HashId::Sha256));
    let mut h = HostConfig::new("nqn.h", "nqn.s", k.clone());
    h.ctrl_key = Some(k.clone());
    let mut c = CtrlConfig::new("nqn.s", "nqn.h", k.clone());
    c.ctrl_key = Some(k);
    // Keep DH cheap: arbitrary bytes mostly fail before it anyway.
    c.dhgroups = vec![DhGroupId::Null];
    (h, c)
}

/// Bytes that start like a real message of the kind, then go random.
fn shaped(ty: u8, id: u8) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..1400).prop_map(move |mut v| {
        if v.len() >= 2 {
            v[0] = ty;
            v[1] = id;
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn host_never_panics(a in shaped(1, 1), b in shaped(1, 3), raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let (hc, _) = configs();
        let mut h = HostAuth::new(Arc::new(hc), 1);
        let _ = h.challenge(&raw);
        let _ = h.negotiate();
        if let Err(e) = h.challenge(&a) {
            let _ = h.failure2(&e);
        }
        let _ = h.success1(&b);
        let _ = h.success1(&raw);
    }

    #[test]
    fn ctrl_never_panics(a in shaped(0, 0), b in shaped(1, 2), c2 in shaped(1, 4), raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let (_, cc) = configs();
        let mut c = CtrlAuth::new(Arc::new(cc));
        let _ = c.reply(&raw);
        if let Err(e) = c.negotiate(&a) {
            let _ = c.failure1(&e);
        }
        let _ = c.reply(&b);
        let _ = c.success2(&c2);
        let _ = c.negotiate(&raw);
    }

    /// After a real negotiate and challenge, random replies and success
    /// messages still never panic.
    #[test]
    fn ctrl_mid_transaction_never_panics(b in shaped(1, 2), s2 in shaped(1, 4)) {
        let (hc, cc) = configs();
        let mut h = HostAuth::new(Arc::new(hc), 1);
        let mut c = CtrlAuth::new(Arc::new(cc));
        let chal = c.negotiate(&h.negotiate().unwrap()).unwrap();
        let _ = h.challenge(&chal).unwrap();
        let _ = c.reply(&b);
        let _ = c.success2(&s2);
    }
}
