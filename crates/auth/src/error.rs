//! Typed errors: a DH-HMAC-CHAP secret that does not parse, and an
//! authentication transaction that fails.

use pollux_spec::fabrics::FailureExplanation;

/// A DH-HMAC-CHAP secret (`DHHC-1:XX:base64:`) that cannot be used. No
/// variant carries any part of the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("DH-HMAC-CHAP secret does not start with \"DHHC-1:\"")]
    BadPrefix,
    #[error("DH-HMAC-CHAP secret: the hash field is not 00, 01, 02 or 03")]
    BadHashId,
    #[error("DH-HMAC-CHAP secret: the key is not valid base64")]
    BadBase64,
    #[error(
        "DH-HMAC-CHAP secret: the key is {0} bytes, expected 32, 48 or 64 (plus a 4-byte CRC)"
    )]
    BadLength(usize),
    #[error("DH-HMAC-CHAP secret: the CRC-32 does not match the key")]
    BadCrc,
    #[error("reading DH-HMAC-CHAP key file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why an authentication transaction failed, on either side.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{msg}: {len} bytes, shorter than the {need} bytes it needs")]
    Truncated {
        msg: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{msg}: {len} bytes, longer than the {max} bytes it may have")]
    Oversized {
        msg: &'static str,
        len: usize,
        max: usize,
    },
    #[error("expected {expected}, received AUTH message type {auth_type:#04x} id {auth_id:#04x}")]
    UnexpectedMessage {
        expected: &'static str,
        auth_type: u8,
        auth_id: u8,
    },
    #[error("{msg}: transaction id {got}, expected {expected}")]
    TransactionId {
        msg: &'static str,
        expected: u16,
        got: u16,
    },
    #[error("{msg}: invalid {field} {value}")]
    BadField {
        msg: &'static str,
        field: &'static str,
        value: u32,
    },
    #[error("the controller refused authentication (AUTH_Failure1): {}", describe(*.explanation))]
    Failure1 { reason: u8, explanation: u8 },
    #[error("the host aborted authentication (AUTH_Failure2): {}", describe(*.explanation))]
    Failure2 { reason: u8, explanation: u8 },
    #[error("AUTH_Negotiate offers no DH-HMAC-CHAP protocol descriptor")]
    ProtocolUnusable,
    #[error("secure channel concatenation (SC_C {0:#x}) is not supported")]
    ConcatUnsupported(u8),
    #[error("no hash function in common (offered: {offered:?})")]
    NoCommonHash { offered: Vec<u8> },
    #[error("no DH group in common (offered: {offered:?})")]
    NoCommonDhGroup { offered: Vec<u8> },
    #[error("hash function {0:#04x} is not usable")]
    HashUnusable(u8),
    #[error("DH group {0:#04x} is not usable")]
    DhGroupUnusable(u8),
    #[error("the peer's DH public value is out of range (1 < y < p-1 fails)")]
    BadDhValue,
    #[error("the host's response does not verify (wrong host secret)")]
    HostResponseMismatch,
    #[error("the controller's response does not verify (wrong controller secret): bidirectional authentication failed")]
    ControllerResponseMismatch,
    #[error("bidirectional authentication requested but the controller sent no response")]
    MissingControllerResponse,
    #[error("the host asks the controller to authenticate but no controller secret is configured")]
    NoControllerKey,
    #[error("{op} called in state {state}")]
    WrongState {
        op: &'static str,
        state: &'static str,
    },
    #[error("no randomness from the operating system: {0}")]
    Random(getrandom::Error),
}

fn describe(exp: u8) -> &'static str {
    FailureExplanation::from_u8(exp).map_or("unknown reason", |e| e.describe())
}

impl AuthError {
    /// The reason code explanation to tell the peer in an AUTH_Failure1
    /// (controller) or AUTH_Failure2 (host) for this error; `None` when
    /// the peer ended the transaction itself or the error is local.
    pub fn explanation(&self) -> Option<FailureExplanation> {
        use FailureExplanation as F;
        Some(match self {
            AuthError::Truncated { .. }
            | AuthError::Oversized { .. }
            | AuthError::TransactionId { .. }
            | AuthError::BadField { .. }
            | AuthError::BadDhValue
            | AuthError::MissingControllerResponse => F::IncorrectPayload,
            AuthError::UnexpectedMessage { .. } => F::IncorrectMessage,
            AuthError::ProtocolUnusable => F::ProtocolUnusable,
            AuthError::ConcatUnsupported(_) => F::ConcatMismatch,
            AuthError::NoCommonHash { .. } | AuthError::HashUnusable(_) => F::HashUnusable,
            AuthError::NoCommonDhGroup { .. } | AuthError::DhGroupUnusable(_) => F::DhGroupUnusable,
            AuthError::HostResponseMismatch
            | AuthError::ControllerResponseMismatch
            | AuthError::NoControllerKey => F::Failed,
            AuthError::Failure1 { .. }
            | AuthError::Failure2 { .. }
            | AuthError::WrongState { .. }
            | AuthError::Random(_) => return None,
        })
    }
}
