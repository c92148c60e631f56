//! The Discovery Log Page (§5.27.1.x).

use core::fmt;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::cmd::CNTLID_DYNAMIC;
use super::nqn::{read_nqn, write_nqn, NqnError, NQN_FIELD_LEN};
use crate::identify::ascii_str;
use crate::{assert_offset, assert_size};

/// Log page identifier of the Discovery Log Page.
pub const LID_DISCOVERY: u8 = 0x70;

/// Transport types (TRTYPE).
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const FC: u8 = 2;
    pub const TCP: u8 = 3;
    pub const INTRA_HOST: u8 = 0xFE;
}

/// Address families (ADRFAM).
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
    pub const IB: u8 = 3;
    pub const FC: u8 = 4;
    pub const INTRA_HOST: u8 = 0xFE;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The discovery subsystem that returned the log.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport requirements (TREQ) bits.
pub mod treq {
    /// Bits 1:0 secure channel: not specified.
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
    /// Bits 1:0 secure channel: required.
    pub const SECURE_CHANNEL_REQUIRED: u8 = 1;
    /// Bits 1:0 secure channel: not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
    /// Bit 2: SQ flow control disable supported.
    pub const SQ_FLOW_DISABLE: u8 = 1 << 2;
}

/// Entry flags (EFLAGS).
pub mod eflags {
    /// Duplicate Returned Information.
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery.
    pub const EPCSD: u16 = 1 << 1;
    /// No CDC Connectivity.
    pub const NCC: u16 = 1 << 2;
}

/// NVMe/TCP TSAS SECTYPE (byte 0 of TSAS).
pub mod tcp_sectype {
    pub const NONE: u8 = 0;
    pub const TLS12: u8 = 1;
    pub const TLS13: u8 = 2;
}

/// Discovery Log Page header (Figure 292), 1024 bytes; entries follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DiscoveryLogHeader {
    /// Generation Counter: changes whenever the log changes.
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record Format (0).
    pub recfmt: u16,
    pub rsvd18: [u8; 1006],
}
assert_size!(DiscoveryLogHeader, 1024);
assert_offset!(DiscoveryLogHeader, genctr, 0);
assert_offset!(DiscoveryLogHeader, numrec, 8);
assert_offset!(DiscoveryLogHeader, recfmt, 16);

impl DiscoveryLogHeader {
    pub fn new(genctr: u64, numrec: u64) -> Self {
        let mut h = DiscoveryLogHeader::new_zeroed();
        h.genctr = genctr;
        h.numrec = numrec;
        h
    }
}

/// Size of a TRSVCID field.
pub const TRSVCID_LEN: usize = 32;
/// Size of a TRADDR field.
pub const TRADDR_LEN: usize = 256;

/// Why a discovery entry field is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{field} {value:?} is {len} bytes, longer than the {max}-byte field")]
    TooLong {
        field: &'static str,
        value: String,
        len: usize,
        max: usize,
    },
    #[error("{field} {value:?} is not printable ASCII")]
    NotAscii { field: &'static str, value: String },
    #[error("SUBNQN: {0}")]
    Nqn(#[from] NqnError),
}

/// Discovery Log Page entry (Figure 293), 1024 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DiscoveryLogEntry {
    /// Transport type ([`trtype`]).
    pub trtype: u8,
    /// Address family ([`adrfam`]).
    pub adrfam: u8,
    /// Subsystem type ([`subtype`]).
    pub subtype: u8,
    /// Transport requirements ([`treq`]).
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID ([`CNTLID_DYNAMIC`] for the dynamic model).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags ([`eflags`]).
    pub eflags: u16,
    pub rsvd12: [u8; 20],
    /// Transport service ID (the TCP port), ASCII, space padded.
    pub trsvcid: [u8; TRSVCID_LEN],
    pub rsvd64: [u8; 192],
    /// Subsystem NQN, NUL-terminated.
    pub subnqn: [u8; NQN_FIELD_LEN],
    /// Transport address (IP address text), ASCII, space padded.
    pub traddr: [u8; TRADDR_LEN],
    /// Transport specific address subtype (TCP: byte 0 SECTYPE).
    pub tsas: [u8; 256],
}
assert_size!(DiscoveryLogEntry, 1024);
assert_offset!(DiscoveryLogEntry, trtype, 0);
assert_offset!(DiscoveryLogEntry, adrfam, 1);
assert_offset!(DiscoveryLogEntry, subtype, 2);
assert_offset!(DiscoveryLogEntry, treq, 3);
assert_offset!(DiscoveryLogEntry, portid, 4);
assert_offset!(DiscoveryLogEntry, cntlid, 6);
assert_offset!(DiscoveryLogEntry, asqsz, 8);
assert_offset!(DiscoveryLogEntry, eflags, 10);
assert_offset!(DiscoveryLogEntry, trsvcid, 32);
assert_offset!(DiscoveryLogEntry, subnqn, 256);
assert_offset!(DiscoveryLogEntry, traddr, 512);
assert_offset!(DiscoveryLogEntry, tsas, 768);

fn write_padded(dst: &mut [u8], field: &'static str, s: &str) -> Result<(), DiscoveryError> {
    if !s.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return Err(DiscoveryError::NotAscii {
            field,
            value: s.to_owned(),
        });
    }
    if s.len() > dst.len() {
        return Err(DiscoveryError::TooLong {
            field,
            value: s.to_owned(),
            len: s.len(),
            max: dst.len(),
        });
    }
    dst.fill(b' ');
    dst[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
}

/// An NVMe/TCP listener a discovery entry describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpEndpoint<'a> {
    /// [`adrfam::IPV4`] or [`adrfam::IPV6`].
    pub adrfam: u8,
    /// Address text, e.g. `"127.0.0.1"`.
    pub traddr: &'a str,
    /// Port text, e.g. `"4420"`.
    pub trsvcid: &'a str,
}

impl DiscoveryLogEntry {
    /// An NVMe/TCP entry for subsystem `subnqn` of `subtype` at `ep`, port
    /// `portid`, dynamic controller model, no TLS, secure channel not
    /// required.
    pub fn tcp(
        subtype: u8,
        portid: u16,
        ep: TcpEndpoint<'_>,
        subnqn: &str,
        asqsz: u16,
    ) -> Result<Self, DiscoveryError> {
        let mut e = DiscoveryLogEntry::new_zeroed();
        e.trtype = trtype::TCP;
        e.adrfam = ep.adrfam;
        e.subtype = subtype;
        e.treq = treq::SECURE_CHANNEL_NOT_REQUIRED;
        e.portid = portid;
        e.cntlid = CNTLID_DYNAMIC;
        e.asqsz = asqsz;
        write_padded(&mut e.trsvcid, "TRSVCID", ep.trsvcid)?;
        write_padded(&mut e.traddr, "TRADDR", ep.traddr)?;
        write_nqn(&mut e.subnqn, subnqn)?;
        e.tsas[0] = tcp_sectype::NONE;
        Ok(e)
    }

    /// TRSVCID without padding (spaces or NULs).
    pub fn trsvcid_str(&self) -> std::borrow::Cow<'_, str> {
        ascii_str(&self.trsvcid)
    }

    /// TRADDR without padding (spaces or NULs).
    pub fn traddr_str(&self) -> std::borrow::Cow<'_, str> {
        ascii_str(&self.traddr)
    }

    /// SUBNQN, validated.
    pub fn subnqn(&self) -> Result<&str, NqnError> {
        read_nqn(&self.subnqn)
    }

    /// TCP security type (TSAS byte 0).
    pub const fn tcp_sectype(&self) -> u8 {
        self.tsas[0]
    }
}

impl fmt::Display for DiscoveryLogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trtype {} adrfam {} subtype {} portid {} traddr {} trsvcid {} subnqn {}",
            self.trtype,
            self.adrfam,
            self.subtype,
            self.portid,
            self.traddr_str(),
            self.trsvcid_str(),
            ascii_str(&self.subnqn)
        )
    }
}
