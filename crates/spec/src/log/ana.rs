//! Asymmetric Namespace Access log page (LID 0Ch), NVMe 2.0c §5.16.1.12 and
//! §8.1.3: the header, the group descriptors, the ANA states and the path
//! status an I/O command gets through a path that cannot serve it.
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

/// Get Log Page LSP bit 0 for the ANA log page: Return Groups Only (RGO).
/// When set, the group descriptors carry no NSID lists (NNSID is 0).
pub const ANA_LSP_RGO: u8 = 1 << 0;

/// Asymmetric Namespace Access state of an ANA group through a controller
/// (group descriptor byte 16 bits 3:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    Optimized = 0x1,
    NonOptimized = 0x2,
    Inaccessible = 0x3,
    PersistentLoss = 0x4,
    Change = 0xF,
}

impl AnaState {
    /// The state for the low four bits of `v`; `None` for a reserved value.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v & 0xF {
            0x1 => Self::Optimized,
            0x2 => Self::NonOptimized,
            0x3 => Self::Inaccessible,
            0x4 => Self::PersistentLoss,
            0xF => Self::Change,
            _ => return None,
        })
    }

    /// SPDK's JSON name (`nvmf_subsystem_listener_set_ana_state`):
    /// `optimized`, `non_optimized`, `inaccessible`, `persistent_loss`,
    /// `change`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::NonOptimized => "non_optimized",
            Self::Inaccessible => "inaccessible",
            Self::PersistentLoss => "persistent_loss",
            Self::Change => "change",
        }
    }

    /// The state named `s` (see [`AnaState::name`]).
    pub fn from_name(s: &str) -> Option<Self> {
        [
            Self::Optimized,
            Self::NonOptimized,
            Self::Inaccessible,
            Self::PersistentLoss,
            Self::Change,
        ]
        .into_iter()
        .find(|st| st.name() == s)
    }

    /// Commands to a namespace in this state are processed (optimized or
    /// non-optimized).
    pub const fn is_accessible(self) -> bool {
        matches!(self, Self::Optimized | Self::NonOptimized)
    }

    /// The path status an I/O command to a namespace in this state
    /// completes with (DNR clear, so a multipath host retries on another
    /// path); `None` when the state is accessible.
    pub const fn io_status(self) -> Option<crate::Status> {
        use crate::status::{path, sct};
        let sc = match self {
            Self::Optimized | Self::NonOptimized => return None,
            Self::Inaccessible => path::ANA_INACCESSIBLE,
            Self::PersistentLoss => path::ANA_PERSISTENT_LOSS,
            Self::Change => path::ANA_TRANSITION,
        };
        Some(crate::Status::new(sct::PATH, sc, false))
    }
}

impl core::fmt::Display for AnaState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// ANA log page header (LID 0Ch), bytes 15:0.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct AnaLogHeader {
    /// Change Count: incremented on each change of the log's content.
    pub chgcnt: u64,
    /// Number of ANA Group Descriptors that follow.
    pub ngrps: u16,
    pub rsvd10: [u8; 6],
}

assert_size!(AnaLogHeader, 16);
assert_offset!(AnaLogHeader, chgcnt, 0);
assert_offset!(AnaLogHeader, ngrps, 8);
assert_offset!(AnaLogHeader, rsvd10, 10);

/// Fixed part of an ANA Group Descriptor, bytes 31:0; `nnsids` NSIDs (u32
/// each, ascending) follow it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct AnaGroupDescHeader {
    /// ANA Group ID (never 0).
    pub anagrpid: u32,
    /// Number of NSID values listed after this header.
    pub nnsids: u32,
    /// Change Count of this group.
    pub chgcnt: u64,
    /// ANA State, bits 3:0 (see [`AnaState`]).
    pub state: u8,
    pub rsvd17: [u8; 15],
}

assert_size!(AnaGroupDescHeader, 32);
assert_offset!(AnaGroupDescHeader, anagrpid, 0);
assert_offset!(AnaGroupDescHeader, nnsids, 4);
assert_offset!(AnaGroupDescHeader, chgcnt, 8);
assert_offset!(AnaGroupDescHeader, state, 16);
assert_offset!(AnaGroupDescHeader, rsvd17, 17);

/// One ANA group as reported by a controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    pub anagrpid: u32,
    pub chgcnt: u64,
    pub state: AnaState,
    /// Attached namespaces of the group (empty in a log read with RGO).
    pub nsids: Vec<u32>,
}

/// The ANA log page as a whole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnaLog {
    pub chgcnt: u64,
    pub groups: Vec<AnaGroup>,
}

/// Why an ANA log page does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnaLogError {
    #[error("ANA log truncated at byte {at}: {need} bytes needed, {len} present")]
    Truncated { at: usize, need: usize, len: usize },
    #[error("ANA group descriptor {index} has ANAGRPID 0")]
    ZeroGroupId { index: usize },
    #[error("ANA group {anagrpid} has reserved ANA state {state:#x}")]
    BadState { anagrpid: u32, state: u8 },
}

impl AnaLog {
    /// Bytes the page takes, with NSID lists unless `rgo`.
    pub fn len(&self, rgo: bool) -> usize {
        let nsids: usize = if rgo {
            0
        } else {
            self.groups.iter().map(|g| g.nsids.len()).sum()
        };
        size_of::<AnaLogHeader>() + self.groups.len() * size_of::<AnaGroupDescHeader>() + 4 * nsids
    }

    /// No group descriptors.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The page's bytes; with `rgo` (Return Groups Only) every descriptor
    /// has NNSID 0 and no NSID list. At most 65535 groups are written.
    pub fn build(&self, rgo: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len(rgo));
        let hdr = AnaLogHeader {
            chgcnt: self.chgcnt,
            ngrps: u16::try_from(self.groups.len()).unwrap_or(u16::MAX),
            ..Default::default()
        };
        out.extend_from_slice(hdr.as_bytes());
        for g in self.groups.iter().take(usize::from(hdr.ngrps)) {
            let nsids: &[u32] = if rgo { &[] } else { &g.nsids };
            let d = AnaGroupDescHeader {
                anagrpid: g.anagrpid,
                nnsids: nsids.len() as u32,
                chgcnt: g.chgcnt,
                state: g.state as u8,
                ..Default::default()
            };
            out.extend_from_slice(d.as_bytes());
            for n in nsids {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }

    /// Parses a whole page (bytes after the last descriptor are ignored).
    /// Descriptors with ANAGRPID 0 or a reserved state are refused, as
    /// Linux refuses them.
    pub fn parse(buf: &[u8]) -> Result<Self, AnaLogError> {
        fn take(buf: &[u8], at: usize, need: usize) -> Result<&[u8], AnaLogError> {
            buf.get(at..at.saturating_add(need))
                .ok_or(AnaLogError::Truncated {
                    at,
                    need,
                    len: buf.len(),
                })
        }
        let hsz = size_of::<AnaLogHeader>();
        let hdr = AnaLogHeader::read_from_bytes(take(buf, 0, hsz)?).map_err(|_| {
            AnaLogError::Truncated {
                at: 0,
                need: hsz,
                len: buf.len(),
            }
        })?;
        let dsz = size_of::<AnaGroupDescHeader>();
        let mut at = hsz;
        let mut groups = Vec::with_capacity(usize::from(hdr.ngrps).min(buf.len() / dsz));
        for index in 0..usize::from(hdr.ngrps) {
            let d = AnaGroupDescHeader::read_from_bytes(take(buf, at, dsz)?).map_err(|_| {
                AnaLogError::Truncated {
                    at,
                    need: dsz,
                    len: buf.len(),
                }
            })?;
            at += dsz;
            if d.anagrpid == 0 {
                return Err(AnaLogError::ZeroGroupId { index });
            }
            let state = AnaState::from_u8(d.state).ok_or(AnaLogError::BadState {
                anagrpid: d.anagrpid,
                state: d.state & 0xF,
            })?;
            let list = take(buf, at, (d.nnsids as usize).saturating_mul(4))?;
            at += list.len();
            let nsids = list
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            groups.push(AnaGroup {
                anagrpid: d.anagrpid,
                chgcnt: d.chgcnt,
                state,
                nsids,
            });
        }
        Ok(Self {
            chgcnt: hdr.chgcnt,
            groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ana_state_values_and_names() {
        for (st, v, n) in [
            (AnaState::Optimized, 1, "optimized"),
            (AnaState::NonOptimized, 2, "non_optimized"),
            (AnaState::Inaccessible, 3, "inaccessible"),
            (AnaState::PersistentLoss, 4, "persistent_loss"),
            (AnaState::Change, 0xF, "change"),
        ] {
            assert_eq!(st as u8, v);
            assert_eq!(AnaState::from_u8(v), Some(st));
            assert_eq!(AnaState::from_u8(v | 0xF0), Some(st));
            assert_eq!(AnaState::from_name(n), Some(st));
            assert_eq!(st.to_string(), n);
        }
        for v in [0u8, 5, 6, 0xE] {
            assert_eq!(AnaState::from_u8(v), None);
        }
        assert_eq!(AnaState::from_name("Optimized"), None);
        assert_eq!(AnaState::Optimized.io_status(), None);
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        let s = AnaState::Inaccessible.io_status().unwrap();
        assert_eq!((s.sct(), s.sc(), s.dnr()), (3, 0x02, false));
        let s = AnaState::PersistentLoss.io_status().unwrap();
        assert_eq!((s.sct(), s.sc(), s.dnr()), (3, 0x01, false));
        let s = AnaState::Change.io_status().unwrap();
        assert_eq!((s.sct(), s.sc(), s.dnr()), (3, 0x03, false));
    }

    fn two_groups() -> AnaLog {
        AnaLog {
            chgcnt: 7,
            groups: vec![
                AnaGroup {
                    anagrpid: 1,
                    chgcnt: 3,
                    state: AnaState::Optimized,
                    nsids: vec![1, 4],
                },
                AnaGroup {
                    anagrpid: 2,
                    chgcnt: 4,
                    state: AnaState::Inaccessible,
                    nsids: vec![2],
                },
            ],
        }
    }

    #[test]
    fn ana_log_layout_and_round_trip() {
        let log = two_groups();
        let b = log.build(false);
        assert_eq!(b.len(), 16 + 32 + 8 + 32 + 4);
        assert_eq!(b.len(), log.len(false));
        assert_eq!(&b[0..8], &7u64.to_le_bytes());
        assert_eq!(&b[8..10], &2u16.to_le_bytes());
        assert_eq!(&b[16..20], &1u32.to_le_bytes());
        assert_eq!(&b[20..24], &2u32.to_le_bytes());
        assert_eq!(&b[24..32], &3u64.to_le_bytes());
        assert_eq!(b[32], 1);
        assert_eq!(&b[48..56], &[1, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(&b[56..60], &2u32.to_le_bytes());
        assert_eq!(&b[60..64], &1u32.to_le_bytes());
        assert_eq!(b[56 + 16], 3);
        assert_eq!(&b[88..92], &2u32.to_le_bytes());
        assert_eq!(AnaLog::parse(&b), Ok(log.clone()));
        // Trailing bytes (a buffer larger than the page) are ignored.
        let mut padded = b.clone();
        padded.resize(4096, 0);
        assert_eq!(AnaLog::parse(&padded), Ok(log));
    }

    #[test]
    fn ana_log_rgo_omits_nsids() {
        let log = two_groups();
        let b = log.build(true);
        assert_eq!(b.len(), 16 + 2 * 32);
        assert_eq!(b.len(), log.len(true));
        assert_eq!(&b[20..24], &0u32.to_le_bytes());
        let back = AnaLog::parse(&b).unwrap();
        assert_eq!(back.groups[1].state, AnaState::Inaccessible);
        assert!(back.groups.iter().all(|g| g.nsids.is_empty()));
        assert_eq!(ANA_LSP_RGO, 1);
    }

    #[test]
    fn ana_log_parse_refusals() {
        let b = two_groups().build(false);
        for cut in [0, 10, 16, 40, 50, b.len() - 1] {
            assert!(
                matches!(AnaLog::parse(&b[..cut]), Err(AnaLogError::Truncated { .. })),
                "cut at {cut}"
            );
        }
        let mut z = b.clone();
        z[56..60].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            AnaLog::parse(&z),
            Err(AnaLogError::ZeroGroupId { index: 1 })
        );
        let mut r = b.clone();
        r[32] = 0;
        assert_eq!(
            AnaLog::parse(&r),
            Err(AnaLogError::BadState {
                anagrpid: 1,
                state: 0
            })
        );
        // A huge NNSID neither overflows nor allocates: it is a truncation.
        let mut h = b;
        h[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            AnaLog::parse(&h),
            Err(AnaLogError::Truncated { .. })
        ));
        assert_eq!(
            AnaLog::parse(&AnaLog::default().build(false)),
            Ok(AnaLog::default())
        );
    }
}
