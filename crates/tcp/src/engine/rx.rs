//! Receive: PDUs reassembled from a byte stream however it is split.
//!
//! [`Reassembler::next`] takes the bytes received and not yet consumed and
//! returns how many it consumed and at most one [`Event`]. A PDU whose
//! bytes are all there is one event ([`Event::Pdu`]: header and data);
//! otherwise its header comes once all of it (and its digest) is in
//! ([`Event::Header`]), then its data as it arrives, in pieces, with the
//! data digest computed on the way ([`Event::Data`]), then the end of the
//! PDU with the digest's verdict. Either way the common header was
//! checked against the receiver's [`RxConfig`] ([`CommonHeader::check`],
//! through a one-entry memo: type, flags, lengths, limits), and
//! [`Reassembler::parse`] reads the rest ([`PduHeader::parse`]: header
//! digest, type-specific fields).
//! Padding before the data is skipped. The caller decides where data goes
//! (it gets slices of its own input) and what each header means: the
//! roles (`host`, `target`) build on this.
use pollux_spec::tcp::{
    CheckMemo, CommonHeader, DataDigest, PduError, PduHeader, PduLayout, RxConfig,
};

/// What [`Reassembler::next`] found. Headers come as `raw` bytes (header
/// and header digest, as received) with their `layout`, for
/// [`Reassembler::parse`]: a parsed `PduHeader` is as large as an ICReq,
/// and moving one through the event costs copies per PDU.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// A whole PDU: its header and its `data` (without padding or digest;
    /// empty for a PDU without data); `digest_ok`: its data digest
    /// matched (true without one).
    Pdu {
        layout: PduLayout,
        raw: &'a [u8],
        data: &'a [u8],
        digest_ok: bool,
    },
    /// The header of a PDU whose data is not all here yet: it follows as
    /// [`Event::Data`] and ends with `Data { end: Some(..) }` or
    /// [`Event::End`].
    Header { layout: PduLayout, raw: &'a [u8] },
    /// `bytes` of the current PDU's data, `offset` bytes into it. `end`:
    /// the PDU is complete with these, and whether its data digest matched
    /// (true without one); `None`: more follows.
    Data {
        offset: u32,
        bytes: &'a [u8],
        end: Option<bool>,
    },
    /// The current PDU is complete (its data digest came after its data):
    /// whether the digest matched.
    End { digest_ok: bool },
}

/// A received header that fails the checks: the error (its FES and FEI
/// make the Termination Request) and where the offending header lies.
#[derive(Clone, Copy, Debug)]
pub struct RxError<'a> {
    pub error: PduError,
    /// The input from the offending header's first byte.
    pub input: &'a [u8],
    /// Its header length: HLEN as received when the common header failed
    /// its check, else the type's HLEN.
    pub hlen: usize,
    /// The header with its digest (as `hlen` when the common header failed).
    pub header_len: usize,
}

impl<'a> RxError<'a> {
    /// The offending header (HLEN bytes), as far as it was received.
    pub fn header(&self) -> &'a [u8] {
        &self.input[..self.input.len().min(self.hlen)]
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    Header,
    /// Inside a PDU after its header: `pos` bytes of it consumed.
    Body {
        layout: PduLayout,
        pos: u32,
        digest: DataDigest,
        ddgst: [u8; 4],
    },
}

/// The receive half of one connection's PDU stream. See the module docs.
#[derive(Clone, Debug)]
pub struct Reassembler {
    /// What headers are checked against, and the last header that passed
    /// its check (most PDUs are alike).
    memo: CheckMemo,
    state: State,
}

impl Reassembler {
    pub fn new(cfg: RxConfig) -> Reassembler {
        Reassembler {
            memo: CheckMemo::new(cfg),
            state: State::Header,
        }
    }

    /// What received headers are checked against.
    pub fn config(&self) -> &RxConfig {
        self.memo.config()
    }

    /// Changes what received headers are checked against (connection
    /// initialization done; limits changed).
    pub fn set_config(&mut self, cfg: RxConfig) {
        self.memo.set_config(cfg);
    }

    /// True between a header and the end of its PDU.
    pub fn in_body(&self) -> bool {
        matches!(self.state, State::Body { .. })
    }

    /// Inside a PDU's data: the offset of its next byte and how many are
    /// left. A caller may receive them straight to where they belong and
    /// report them with [`data_taken`](Self::data_taken).
    pub fn data_window(&self) -> Option<(u32, u32)> {
        match self.state {
            State::Body { layout, pos, .. } => {
                let r = layout.data_range();
                let (ds, de) = (r.start as u32, r.end as u32);
                (pos >= ds && pos < de).then(|| (pos - ds, de - pos))
            }
            State::Header => None,
        }
    }

    /// `bytes` of the current PDU's data (at the offset
    /// [`data_window`](Self::data_window) gave, at most as many as it
    /// left) were received by the caller directly. The end of the PDU is
    /// then an event of [`next`](Self::next), as usual.
    pub fn data_taken(&mut self, bytes: &[u8]) {
        if let State::Body {
            layout,
            pos,
            digest,
            ..
        } = &mut self.state
        {
            let end = layout.data_range().end as u32;
            let n = (bytes.len() as u32).min(end.saturating_sub(*pos));
            if layout.ddgst {
                digest.update(&bytes[..n as usize]);
            }
            *pos += n;
        }
    }

    /// Consumes what it can of `input` (the bytes received and not yet
    /// consumed): returns how many bytes it took and the event they made,
    /// or `None` when more bytes are needed. Call again with the rest until
    /// it returns `None`.
    #[inline(always)]
    pub fn next<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Option<Event<'a>>), RxError<'a>> {
        match self.state {
            State::Header => self.header(input),
            State::Body { .. } => Ok(self.body(input)),
        }
    }

    /// Parses the header of a [`Event::Header`] (`layout`, `raw`):
    /// verifies the header digest and the type-specific fields (ICReq and
    /// ICResp parameters, DATAL against the layout and MAXH2CDATA, R2TL).
    #[inline(always)]
    pub fn parse<'a>(&self, layout: &PduLayout, raw: &'a [u8]) -> Result<PduHeader, RxError<'a>> {
        PduHeader::parse(raw, layout, self.memo.config()).map_err(|error| RxError {
            error,
            input: raw,
            hlen: layout.hlen as usize,
            header_len: raw.len(),
        })
    }

    #[inline(always)]
    fn header<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Option<Event<'a>>), RxError<'a>> {
        let Some(ch) = CommonHeader::read(input) else {
            return Ok((0, None));
        };
        let layout = match self.memo.check(&ch) {
            Ok(l) => l,
            Err(error) => {
                return Err(RxError {
                    error,
                    input,
                    hlen: ch.hlen as usize,
                    header_len: ch.hlen as usize,
                });
            }
        };
        let need = layout.header_len() as usize;
        if input.len() < need {
            return Ok((0, None));
        }
        let raw = &input[..need];
        let plen = layout.plen as usize;
        if input.len() >= plen {
            // All of it is here: one event, no state.
            let r = layout.data_range();
            let data = &input[r.start..r.end];
            let digest_ok = !layout.ddgst || {
                let mut d = DataDigest::new();
                d.update(data);
                input[r.end..r.end + 4] == d.value().to_le_bytes()
            };
            return Ok((
                plen,
                Some(Event::Pdu {
                    layout,
                    raw,
                    data,
                    digest_ok,
                }),
            ));
        }
        self.state = State::Body {
            layout,
            pos: need as u32,
            digest: DataDigest::new(),
            ddgst: [0; 4],
        };
        Ok((need, Some(Event::Header { layout, raw })))
    }

    #[inline(always)]
    fn body<'a>(&mut self, input: &'a [u8]) -> (usize, Option<Event<'a>>) {
        let State::Body {
            layout,
            pos,
            digest,
            ddgst,
        } = &mut self.state
        else {
            return (0, None);
        };
        let r = layout.data_range();
        let (ds, de) = (r.start as u32, r.end as u32);
        let mut used = 0usize;
        // Padding up to the data.
        if *pos < ds {
            let k = (ds - *pos).min(input.len() as u32);
            *pos += k;
            used += k as usize;
        }
        if *pos >= ds && *pos < de && used < input.len() {
            let k = (de - *pos).min((input.len() - used) as u32) as usize;
            let bytes = &input[used..used + k];
            if layout.ddgst {
                digest.update(bytes);
            }
            let offset = *pos - ds;
            *pos += k as u32;
            used += k;
            let end = if *pos < de {
                None
            } else {
                // The digest too, if it is here.
                let (n, ok) = Self::digest(layout, pos, digest, ddgst, &input[used..]);
                used += n;
                ok
            };
            if end.is_some() {
                self.state = State::Header;
            }
            return (used, Some(Event::Data { offset, bytes, end }));
        }
        if *pos >= de {
            let (n, ok) = Self::digest(layout, pos, digest, ddgst, &input[used..]);
            used += n;
            if let Some(digest_ok) = ok {
                self.state = State::Header;
                return (used, Some(Event::End { digest_ok }));
            }
        }
        (used, None)
    }

    /// Takes what `input` has of the data digest (the data is complete):
    /// the bytes taken and, once all four are in (or there is none),
    /// whether it matched.
    #[inline(always)]
    fn digest(
        layout: &PduLayout,
        pos: &mut u32,
        digest: &DataDigest,
        ddgst: &mut [u8; 4],
        input: &[u8],
    ) -> (usize, Option<bool>) {
        if !layout.ddgst {
            return (0, Some(true));
        }
        let de = layout.data_range().end as u32;
        let have = *pos - de;
        let k = (layout.plen - *pos).min(input.len() as u32) as usize;
        ddgst[have as usize..have as usize + k].copy_from_slice(&input[..k]);
        *pos += k as u32;
        if *pos < layout.plen {
            return (k, None);
        }
        (k, Some(digest.value() == u32::from_le_bytes(*ddgst)))
    }
}
