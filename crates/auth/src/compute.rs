//! The DH-HMAC-CHAP computations (NVMe Base 2.x §8.13.5; Linux
//! `drivers/nvme/{host,target}/auth.c`, SPDK `spdk_nvme_dhchap_calculate`).

use pollux_spec::fabrics::HashId;

use crate::bytes::Secret;
use crate::digest::{hash, hmac_parts};

/// Who a response authenticates: the host's R1 uses "HostHost", the
/// controller's R2 "Controller".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Host,
    Controller,
}

impl Role {
    const fn label(self) -> &'static [u8] {
        match self {
            Role::Host => b"HostHost",
            Role::Controller => b"Controller",
        }
    }
}

/// The challenge a response is computed over: C itself without DH, else
/// the augmented challenge HMAC-H(H(Ks), C) with Ks the DH shared secret
/// (Linux `nvme_auth_augmented_challenge`).
pub fn augmented_challenge(h: HashId, session_key: Option<&Secret>, challenge: &[u8]) -> Secret {
    match session_key {
        None => Secret::new(challenge.to_vec()),
        Some(ks) => {
            let hk = hash(h, ks.expose());
            hmac_parts(h, hk.expose(), &[challenge])
        }
    }
}

/// A response: HMAC-H(key, Ca || seqnum LE32 || TID LE16 || SC_C=0 ||
/// label || nqn1 || 0x00 || nqn2), where `key` is the transformed key
/// (transformed with nqn1), Ca the augmented challenge; nqn1/nqn2 are
/// hostnqn/subnqn for the host's response and subnqn/hostnqn for the
/// controller's.
#[allow(clippy::too_many_arguments)]
pub fn response(
    h: HashId,
    key: &Secret,
    aug_challenge: &Secret,
    seqnum: u32,
    t_id: u16,
    role: Role,
    nqn1: &str,
    nqn2: &str,
) -> Secret {
    hmac_parts(
        h,
        key.expose(),
        &[
            aug_challenge.expose(),
            &seqnum.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[0u8],
            role.label(),
            nqn1.as_bytes(),
            &[0u8],
            nqn2.as_bytes(),
        ],
    )
}
