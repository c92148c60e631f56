//! NVMe in-band authentication, DH-HMAC-CHAP (NVMe Base 2.x §8.13), the
//! way Linux and SPDK speak it:
//!
//! - [`DhchapKey`]: a DHHC-1 secret (`nvme gen-dhchap-key`'s text form),
//!   CRC-checked, with Linux's key transformation; [`Secret`] bytes are
//!   zeroised on drop and never printed.
//! - [`HostAuth`] and [`CtrlAuth`]: the two sides of one transaction as
//!   I/O-free state machines; the caller carries their messages with
//!   Authentication Send/Receive (`pollux_spec::fabrics::AuthCmd`).
//! - SHA-256/384/512 (RustCrypto `sha2`/`hmac`) and the null and RFC 7919
//!   ffdhe2048..8192 Diffie-Hellman groups (`crypto-bigint`).

mod bytes;
mod compute;
mod ctrl;
mod dh;
mod digest;
mod error;
mod host;
pub mod msg;
mod random;
mod secret;

pub use bytes::Secret;
pub use compute::{augmented_challenge, response, Role};
pub use ctrl::{CtrlAuth, CtrlConfig};
pub use dh::{prime_bytes, DhKeyPair};
pub use digest::{hash, hmac_parts};
pub use error::{AuthError, SecretError};
pub use host::{HostAuth, HostConfig};
pub use pollux_spec::fabrics::{DhGroupId, FailureExplanation, HashId};
pub use secret::DhchapKey;
