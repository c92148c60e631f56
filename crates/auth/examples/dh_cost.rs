//! What one DH-HMAC-CHAP exchange costs the target's thread in
//! Diffie-Hellman arithmetic, per group: a key pair generated and the
//! shared secret computed (the target does both for each queue a host
//! authenticates). Median and range of `--rounds` (default 5) runs.
//!
//!     cargo run --release -p pollux-auth --example dh_cost [-- ROUNDS]
use std::time::Instant;

use pollux_auth::{DhGroupId, DhKeyPair};

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    for g in [
        DhGroupId::Ffdhe2048,
        DhGroupId::Ffdhe3072,
        DhGroupId::Ffdhe4096,
        DhGroupId::Ffdhe6144,
        DhGroupId::Ffdhe8192,
    ] {
        let mut ms: Vec<f64> = (0..rounds)
            .map(|_| {
                let peer = DhKeyPair::generate(g).expect("peer key pair");
                let t = Instant::now();
                let mine = DhKeyPair::generate(g).expect("key pair");
                let _ = mine.shared(peer.public()).expect("shared secret");
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "{g:?}: {:.1} ms per exchange (median; range {:.1}-{:.1}, n={rounds})",
            ms[rounds / 2],
            ms[0],
            ms[rounds - 1]
        );
    }
}
