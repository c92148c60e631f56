//! NVMe Qualified Names: lengths, validation, reading and writing NQN
//! fields.

/// Size of an NQN field in Connect data, Identify and the Discovery Log.
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN in bytes, without the terminating NUL.
pub const NQN_MAX_LEN: usize = 223;
/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of NQNs derived from a UUID.
pub const NQN_UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why an NQN is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    #[error("NQN is empty")]
    Empty,
    #[error("NQN is {len} bytes, longer than {NQN_MAX_LEN}")]
    TooLong { len: usize },
    #[error("NQN field has no terminating NUL within {NQN_FIELD_LEN} bytes")]
    NotTerminated,
    #[error("NQN is not valid UTF-8 (at byte {at})")]
    NotUtf8 { at: usize },
    #[error("NQN has control character {byte:#04x} at byte {at}")]
    ControlChar { at: usize, byte: u8 },
    /// A name given by a user that is not an NQN (see [`check_nqn`]).
    #[error(
        "not an NQN: an NQN starts with \"nqn.\" (e.g. nqn.2016-06.io.spdk:cnode1, or {NQN_UUID_PREFIX}UUID)"
    )]
    NoPrefix,
}

/// Checks an NQN: 1 to 223 bytes of UTF-8 (the specification's encoding;
/// in practice ASCII) without control characters or NUL.
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.is_empty() {
        return Err(NqnError::Empty);
    }
    if nqn.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong { len: nqn.len() });
    }
    if let Some(at) = nqn.bytes().position(|b| b < 0x20 || b == 0x7F) {
        return Err(NqnError::ControlChar {
            at,
            byte: nqn.as_bytes()[at],
        });
    }
    Ok(())
}

/// Checks an NQN a user gives (a command line, a transport ID, a
/// configuration file): [`validate_nqn`], and the "nqn." every NQN form
/// starts with (`nqn.yyyy-mm.reverse-domain:...`, the UUID form
/// [`NQN_UUID_PREFIX`], the well-known [`DISCOVERY_NQN`]). What arrives on
/// the wire is only validated: peers that send other names still connect.
pub fn check_nqn(nqn: &str) -> Result<(), NqnError> {
    validate_nqn(nqn)?;
    if !nqn.starts_with("nqn.") {
        return Err(NqnError::NoPrefix);
    }
    Ok(())
}

/// Writes a validated NQN, NUL-terminated and zero-filled, into `field`.
pub fn write_nqn(field: &mut [u8; NQN_FIELD_LEN], nqn: &str) -> Result<(), NqnError> {
    validate_nqn(nqn)?;
    field.fill(0);
    field[..nqn.len()].copy_from_slice(nqn.as_bytes());
    Ok(())
}

/// Reads and validates the NUL-terminated NQN in `field`.
pub fn read_nqn(field: &[u8]) -> Result<&str, NqnError> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(NqnError::NotTerminated)?;
    let s = core::str::from_utf8(&field[..end]).map_err(|e| NqnError::NotUtf8 {
        at: e.valid_up_to(),
    })?;
    validate_nqn(s)?;
    Ok(s)
}
