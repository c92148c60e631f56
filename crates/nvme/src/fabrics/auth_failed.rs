//! A failed in-band authentication, told with the controller it was
//! with and what went wrong.
use std::fmt;

use pollux_auth::AuthError;
use pollux_spec::Status;

/// What went wrong authenticating one queue.
#[derive(Debug, thiserror::Error)]
pub enum AuthFailure {
    #[error("the controller requires authentication (AUTHREQ.ATR) but no DH-HMAC-CHAP key is configured (give dhchap_key:PATH)")]
    KeyMissing,
    #[error("the controller requires a secure channel after authentication (AUTHREQ.ASCR), which is not supported")]
    SecureChannelRequired,
    /// An Authentication Send/Receive completed with an error status
    /// (a controller without in-band authentication answers so).
    #[error("{cmd} failed: {status}")]
    Command { cmd: &'static str, status: Status },
    /// The exchange failed: the controller refused us (AUTH_Failure1,
    /// with its reason), its own response did not verify
    /// (bidirectional), or a message was wrong.
    #[error("{0}")]
    Protocol(#[from] AuthError),
}

/// An authentication that failed, with the controller it was with.
#[derive(Debug)]
pub struct AuthFailed {
    /// The controller's address.
    pub addr: String,
    pub subnqn: String,
    /// The controller ID the Connect returned.
    pub cntlid: u16,
    /// The queue (0: admin).
    pub qid: u16,
    pub failure: AuthFailure,
}

impl AuthFailed {
    /// True when the controller failed to prove it knows the controller
    /// secret (bidirectional authentication).
    pub fn controller_rejected(&self) -> bool {
        matches!(
            self.failure,
            AuthFailure::Protocol(AuthError::ControllerResponseMismatch)
                | AuthFailure::Protocol(AuthError::MissingControllerResponse)
        )
    }
}

impl fmt::Display for AuthFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DH-HMAC-CHAP authentication with controller {} of {} at {} (queue {}) failed: {}",
            self.cntlid, self.subnqn, self.addr, self.qid, self.failure
        )
    }
}

impl std::error::Error for AuthFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.failure)
    }
}
