//! Discovery: the Discovery Log Page of an NVMe/TCP discovery controller.
use pollux_spec::fabrics::{DiscoveryLogEntry, DISCOVERY_NQN};

use crate::ctrl::ConnectError;
use crate::trid::TcpTrid;

/// Reads the Discovery Log Page of the discovery controller at `t`
/// (`subnqn:` defaults to the well-known discovery NQN): connect, enable,
/// Get Log Page, disable.
pub fn discover(t: &TcpTrid) -> Result<Vec<DiscoveryLogEntry>, ConnectError> {
    Ok(pollux_tcp::discover(t.options(Some(DISCOVERY_NQN))?)?)
}

impl ConnectError {
    /// The connection to the controller could not be set up (TCP connect,
    /// ICReq): nothing answered where the transport ID points.
    pub fn is_unreachable(&self) -> bool {
        let ConnectError::Driver(pollux_nvme::Error::Io(io)) = self else {
            return false;
        };
        io.get_ref()
            .and_then(|r| r.downcast_ref::<pollux_tcp::ConnError>())
            .is_some_and(|c| c.kind == pollux_tcp::ConnErrorKind::Connect)
    }
}
