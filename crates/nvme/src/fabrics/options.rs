//! What every fabrics association needs, whatever the transport: names,
//! Keep Alive, and the reconnect policy.
use std::time::Duration;

use pollux_auth::{DhGroupId, DhchapKey, HashId};

/// The transport-independent options of a fabrics controller.
#[derive(Clone, Debug)]
pub struct FabricsOptions {
    /// Subsystem NQN (`subnqn`).
    pub subnqn: String,
    /// Host NQN (`hostnqn`).
    pub hostnqn: String,
    /// Host Identifier.
    pub hostid: [u8; 16],
    /// Keep Alive Timeout in ms (0: none); Keep Alive goes out every KATO/2.
    pub kato_ms: u32,
    /// How long a lost controller is reconnected before it is given up
    /// (`ctrl_loss_tmo`; None: forever).
    pub ctrl_loss_tmo: Option<Duration>,
    /// Time between reconnect attempts (`reconnect_delay`; not zero; the
    /// first attempt is immediate).
    pub reconnect_delay: Duration,
    /// I/O held while reconnecting fails once the reconnect has taken this
    /// long (`fast_io_fail_tmo`; None: held until the reconnect ends).
    pub fast_io_fail_tmo: Option<Duration>,
    /// Bound on Connect and on Property Get/Set.
    pub admin_timeout: Duration,
    /// Keep SQ flow control on the I/O queues (`sqflow:1`); off, Connect
    /// asks the controller to disable it.
    pub sq_flow: bool,
    /// In-band authentication (DH-HMAC-CHAP) after each Connect.
    pub auth: AuthOptions,
}

/// The host's DH-HMAC-CHAP settings (TRID keys `dhchap_key:`,
/// `dhchap_ctrlr_key:`, `dhchap_digests:`, `dhchap_dhgroups:`).
#[derive(Clone, Debug, Default)]
pub struct AuthOptions {
    /// The host's secret; `None`: no authentication unless the controller
    /// asks for it (and then an error).
    pub key: Option<DhchapKey>,
    /// The controller's secret: the controller must authenticate too
    /// (bidirectional), else it is refused.
    pub ctrl_key: Option<DhchapKey>,
    /// Hashes offered (empty: SHA-256, SHA-384, SHA-512).
    pub digests: Vec<HashId>,
    /// DH groups offered (empty: null and ffdhe2048..ffdhe8192).
    pub dhgroups: Vec<DhGroupId>,
}
