//! Where the parts of a PDU lie, and checking a received common header
//! against the receiver's configuration.

use core::ops::Range;

use zerocopy::FromBytes;

use super::common::CommonHeader;
use super::error::{Field, PduError, Problem};
use super::term::TERM_REQ_MAX_PLEN;
use super::{flags, pda_alignment, Digests, PduType, Role, DIGEST_LEN, MAX_PDA, MIN_MAXH2CDATA};

/// Where the parts of a PDU lie, in bytes from its start. Built by
/// [`CommonHeader::check`] for received PDUs and by [`PduLayout::new`] for
/// PDUs to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PduLayout {
    pub pdu_type: PduType,
    /// Header length (HLEN).
    pub hlen: u32,
    /// A header digest follows the header.
    pub hdgst: bool,
    /// Offset of the data; equals HLEN (+ digest) for a Termination
    /// Request, whose PDO field is 0; 0 when there is no data.
    pub data_offset: u32,
    /// Bytes of data, without padding and digest.
    pub data_len: u32,
    /// A data digest follows the data.
    pub ddgst: bool,
    /// Total length (PLEN).
    pub plen: u32,
}

impl PduLayout {
    /// The layout of a PDU to send: `pda` is the receiver's PDA (0's based
    /// dwords), used only when there is data. Digests apply to types that
    /// carry them (a data digest only with data).
    ///
    /// Returns `None` if PDO would not fit its byte or PLEN its 32 bits.
    pub const fn new(pdu_type: PduType, digests: Digests, pda: u8, data_len: u32) -> Option<Self> {
        let hlen = pdu_type.hlen() as u32;
        let hdgst = digests.header && pdu_type.allowed_flags() & flags::HDGSTF != 0;
        let ddgst = digests.data && data_len > 0 && pdu_type.carries_data();
        let full = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let data_offset = if data_len == 0 {
            0
        } else if pdu_type.carries_data() {
            let a = pda_alignment(if pda > MAX_PDA { MAX_PDA } else { pda });
            // PDA 0 (dword alignment, what hosts ask for) without a
            // division.
            let o = if a == 4 {
                (full + 3) & !3
            } else {
                full.div_ceil(a) * a
            };
            if o > 255 {
                return None;
            }
            o
        } else {
            full
        };
        let end = if data_len == 0 { full } else { data_offset };
        let plen = match end.checked_add(data_len) {
            Some(v) => v,
            None => return None,
        };
        let plen = match plen.checked_add(if ddgst { DIGEST_LEN } else { 0 }) {
            Some(v) => v,
            None => return None,
        };
        Some(PduLayout {
            pdu_type,
            hlen,
            hdgst,
            data_offset,
            data_len,
            ddgst,
            plen,
        })
    }

    /// Header length plus header digest.
    #[inline]
    pub const fn header_len(&self) -> u32 {
        self.hlen + if self.hdgst { DIGEST_LEN } else { 0 }
    }

    /// Range of the header digest, if present.
    pub fn header_digest_range(&self) -> Option<Range<usize>> {
        self.hdgst
            .then(|| self.hlen as usize..(self.hlen + DIGEST_LEN) as usize)
    }

    /// Range of the data (empty at the header's end when there is none).
    pub fn data_range(&self) -> Range<usize> {
        if self.data_len == 0 {
            let e = self.header_len() as usize;
            return e..e;
        }
        let o = self.data_offset as usize;
        o..o + self.data_len as usize
    }

    /// Range of the data digest, if present.
    pub fn data_digest_range(&self) -> Option<Range<usize>> {
        self.ddgst.then(|| {
            let e = self.data_range().end;
            e..e + DIGEST_LEN as usize
        })
    }

    /// Bytes before the data: header, header digest and padding (what
    /// [`write_header`](super::write_header) writes).
    #[inline]
    pub const fn prefix_len(&self) -> u32 {
        if self.data_len == 0 {
            self.header_len()
        } else {
            self.data_offset
        }
    }

    /// Padding bytes between header (digest) and data.
    #[inline]
    pub const fn pad_len(&self) -> u32 {
        self.prefix_len() - self.header_len()
    }

    /// The common header describing this layout, with `extra_flags`
    /// (LAST_PDU, SUCCESS) added to the digest flags.
    pub const fn common_header(&self, extra_flags: u8) -> CommonHeader {
        let mut f = extra_flags;
        if self.hdgst {
            f |= flags::HDGSTF;
        }
        if self.ddgst {
            f |= flags::DDGSTF;
        }
        CommonHeader {
            pdu_type: self.pdu_type as u8,
            flags: f,
            hlen: self.hlen as u8,
            pdo: if self.pdu_type.carries_data() {
                self.data_offset as u8
            } else {
                0
            },
            plen: self.plen,
        }
    }
}

/// What a receiver checks a PDU header against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxConfig {
    /// The receiving side: a controller accepts host PDUs and vice versa.
    pub receiver: Role,
    /// Whether ICReq/ICResp has been exchanged. Before, only the IC PDU and
    /// Termination Requests are accepted; after, IC PDUs are a sequence
    /// error.
    pub established: bool,
    /// Negotiated digests (ignored before `established`).
    pub digests: Digests,
    /// The receiver's own PDA (CPDA for a controller, HPDA for a host).
    pub pda: u8,
    /// Largest PLEN accepted for CapsuleCmd, CapsuleResp, H2CData, C2HData
    /// and R2T (a controller derives it from IOCCSZ and MAXH2CDATA).
    pub max_plen: u32,
    /// MAXH2CDATA the controller announced (checked on H2CData).
    pub maxh2cdata: u32,
}

impl RxConfig {
    /// The configuration before connection initialization.
    pub const fn initial(receiver: Role) -> Self {
        RxConfig {
            receiver,
            established: false,
            digests: Digests::NONE,
            pda: 0,
            max_plen: 128,
            maxh2cdata: MIN_MAXH2CDATA,
        }
    }

    /// The largest PLEN of a PDU of `pdu_type` carrying `max_data` bytes
    /// under this configuration (for [`RxConfig::max_plen`]).
    pub const fn plen_for(&self, pdu_type: PduType, max_data: u32) -> u32 {
        match PduLayout::new(pdu_type, self.digests, self.pda, max_data) {
            Some(l) => l.plen,
            None => u32::MAX,
        }
    }
}

impl CommonHeader {
    /// Reads a common header from the first 8 bytes of `bytes`.
    pub fn read(bytes: &[u8]) -> Option<Self> {
        CommonHeader::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }

    /// Checks a received header against `cfg` and returns the PDU's layout.
    ///
    /// Fields are checked in order of their offsets where the rules allow,
    /// so the FEI names the first bad one: PDU type (defined, from the
    /// peer, allowed in this phase), flags (allowed for the type, HDGSTF as
    /// negotiated, DDGSTF only when negotiated and data present, SUCCESS
    /// only with LAST_PDU), HLEN (exact), PDO (0 without data; otherwise at
    /// least HLEN + header digest, a multiple of the receiver's PDA and
    /// within PLEN), PLEN (exact for IC PDUs, 24..=152 for Termination
    /// Requests, else at least the header, data and digests and at most
    /// `cfg.max_plen`).
    pub fn check(&self, cfg: &RxConfig) -> Result<PduLayout, PduError> {
        let raw = self.pdu_type;
        let invalid = |field, value: u32, problem| PduError::InvalidField {
            pdu_type: raw,
            field,
            value,
            problem,
        };
        let Some(ty) = PduType::from_u8(raw) else {
            return Err(invalid(Field::PduType, raw as u32, Problem::UnknownType));
        };
        if ty.sender() == cfg.receiver {
            return Err(invalid(
                Field::PduType,
                raw as u32,
                Problem::WrongDirection {
                    receiver: cfg.receiver,
                },
            ));
        }
        if ty.is_init() && cfg.established {
            return Err(PduError::Sequence {
                pdu_type: ty,
                state: "after connection initialization",
            });
        }
        if !ty.is_init() && !ty.is_term() && !cfg.established {
            return Err(PduError::Sequence {
                pdu_type: ty,
                state: "before connection initialization",
            });
        }

        // Flags.
        let fl = self.flags;
        let allowed = ty.allowed_flags();
        if fl & !allowed != 0 {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::FlagsNotAllowed { allowed },
            ));
        }
        let hdgst = fl & flags::HDGSTF != 0;
        let ddgst = fl & flags::DDGSTF != 0;
        if allowed & flags::HDGSTF != 0 && hdgst != cfg.digests.header {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::HeaderDigestFlag {
                    negotiated: cfg.digests.header,
                },
            ));
        }
        if ddgst && !cfg.digests.data {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::DataDigestFlag {
                    negotiated: false,
                    has_data: self.pdo != 0,
                },
            ));
        }
        if fl & (flags::SUCCESS | flags::LAST_PDU) == flags::SUCCESS {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::SuccessWithoutLast,
            ));
        }

        // HLEN.
        let hlen = ty.hlen();
        if self.hlen != hlen {
            return Err(invalid(
                Field::Hlen,
                self.hlen as u32,
                Problem::NotEqual {
                    expected: hlen as u32,
                },
            ));
        }
        let hlen = hlen as u32;
        let full = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let plen = self.plen;
        let pdo = self.pdo as u32;

        // IC and Termination PDUs: PDO 0, fixed or bounded PLEN.
        if !ty.carries_data() && !matches!(ty, PduType::CapsuleResp | PduType::R2T) {
            if pdo != 0 {
                return Err(invalid(Field::Pdo, pdo, Problem::NotEqual { expected: 0 }));
            }
            if ty.is_init() {
                if plen != hlen {
                    return Err(invalid(
                        Field::Plen,
                        plen,
                        Problem::NotEqual { expected: hlen },
                    ));
                }
                return Ok(PduLayout {
                    pdu_type: ty,
                    hlen,
                    hdgst: false,
                    data_offset: 0,
                    data_len: 0,
                    ddgst: false,
                    plen,
                });
            }
            if !(hlen..=TERM_REQ_MAX_PLEN).contains(&plen) {
                return Err(PduError::TermReqLength { pdu_type: ty, plen });
            }
            let data_len = plen - hlen;
            return Ok(PduLayout {
                pdu_type: ty,
                hlen,
                hdgst: false,
                data_offset: if data_len == 0 { 0 } else { hlen },
                data_len,
                ddgst: false,
                plen,
            });
        }

        // PDO.
        let has_data = pdo != 0;
        if !ty.carries_data() {
            if pdo != 0 {
                return Err(invalid(Field::Pdo, pdo, Problem::NotEqual { expected: 0 }));
            }
        } else if pdo == 0 {
            if ty != PduType::CapsuleCmd {
                // H2CData and C2HData always carry data.
                return Err(invalid(Field::Pdo, pdo, Problem::Below { min: full }));
            }
        } else {
            if pdo < full {
                return Err(invalid(Field::Pdo, pdo, Problem::Below { min: full }));
            }
            let align = pda_alignment(cfg.pda.min(MAX_PDA));
            if !pdo.is_multiple_of(align) {
                return Err(invalid(Field::Pdo, pdo, Problem::Misaligned { align }));
            }
            if pdo > plen {
                return Err(invalid(Field::Pdo, pdo, Problem::Above { max: plen }));
            }
        }
        if ddgst != (cfg.digests.data && has_data) {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::DataDigestFlag {
                    negotiated: cfg.digests.data,
                    has_data,
                },
            ));
        }

        // PLEN.
        let dd = if ddgst { DIGEST_LEN } else { 0 };
        let data_len = if has_data {
            // At least one byte of data after PDO.
            let min = pdo + 1 + dd;
            if plen < min {
                return Err(invalid(Field::Plen, plen, Problem::Below { min }));
            }
            plen - pdo - dd
        } else {
            if plen != full {
                return Err(invalid(
                    Field::Plen,
                    plen,
                    Problem::NotEqual { expected: full },
                ));
            }
            0
        };
        if plen > cfg.max_plen {
            return Err(invalid(
                Field::Plen,
                plen,
                Problem::Above { max: cfg.max_plen },
            ));
        }
        Ok(PduLayout {
            pdu_type: ty,
            hlen,
            hdgst,
            data_offset: if has_data { pdo } else { 0 },
            data_len,
            ddgst,
            plen,
        })
    }
}

/// [`CommonHeader::check`] under a configuration the memo holds, with a
/// one-entry memo: the last header that passed and its layout. A stream of
/// like PDUs (command capsules without data, 4 KiB C2HData) is checked by
/// one comparison of the header's 8 bytes; any other header goes through
/// the full check.
///
/// The check is a function of the header and the configuration alone, and
/// [`set_config`](Self::set_config) forgets the remembered header, so a hit
/// returns exactly what the check would (the configuration is not compared
/// on every PDU).
#[derive(Clone, Copy, Debug)]
pub struct CheckMemo {
    cfg: RxConfig,
    /// The 8 bytes of the last header that passed under `cfg` (as one
    /// word), and its layout.
    last: Option<(u64, PduLayout)>,
}

impl CheckMemo {
    /// A memo checking against `cfg`, remembering nothing yet.
    pub const fn new(cfg: RxConfig) -> Self {
        CheckMemo { cfg, last: None }
    }

    /// What headers are checked against.
    #[inline]
    pub const fn config(&self) -> &RxConfig {
        &self.cfg
    }

    /// Checks headers against `cfg` from now on (and forgets the last
    /// header, which passed under the old configuration).
    pub fn set_config(&mut self, cfg: RxConfig) {
        self.cfg = cfg;
        self.last = None;
    }

    /// [`CommonHeader::check`] of `ch` under [`config`](Self::config),
    /// remembered when it passes.
    #[inline]
    pub fn check(&mut self, ch: &CommonHeader) -> Result<PduLayout, PduError> {
        let key: u64 = zerocopy::transmute!(*ch);
        if let Some((k, l)) = &self.last {
            if *k == key {
                return Ok(*l);
            }
        }
        let l = ch.check(&self.cfg)?;
        self.last = Some((key, l));
        Ok(l)
    }
}
