//! The send queue: PDU headers (and response capsules, digests,
//! padding) copied into one byte buffer, data referenced in place.
use pollux_spec::tcp::{append_header, PduLayout};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Seg {
    Bytes { start: usize, len: usize },
    Data { ptr: *const u8, len: usize },
    Release { slot: u16 },
}

/// What is queued for the socket.
#[derive(Default)]
pub(crate) struct Tx {
    pub(crate) bytes: Vec<u8>,
    /// Segments; those before `head` are sent. Emptied (and `head` reset)
    /// when the last one is: a queue that drains, as this one does, needs
    /// no ring.
    pub(crate) segs: Vec<Seg>,
    pub(crate) head: usize,
    /// Bytes of the front segment already sent.
    pub(crate) front: usize,
}

impl Tx {
    pub(crate) fn push(&mut self, seg: Seg) {
        self.segs.push(seg);
    }

    /// The segments not yet sent.
    pub(crate) fn pending(&self) -> &[Seg] {
        &self.segs[self.head..]
    }

    pub(crate) fn front(&self) -> Option<Seg> {
        self.segs.get(self.head).copied()
    }

    pub(crate) fn pop_front(&mut self) {
        self.head += 1;
        if self.head >= self.segs.len() {
            self.segs.clear();
            self.head = 0;
        }
    }

    pub(crate) fn push_bytes(&mut self, b: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.push_range(start, b.len());
    }

    /// Queues `bytes[start..start + len]`, just appended.
    pub(crate) fn push_range(&mut self, start: usize, len: usize) {
        // Only a pending segment is ever last (`pop_front` empties a
        // drained queue).
        if let Some(Seg::Bytes { start: s, len: l }) = self.segs.last_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
        self.push(Seg::Bytes { start, len });
    }

    /// A PDU header with its digest and padding per `layout`.
    pub(crate) fn push_header(&mut self, header: &[u8], layout: &PduLayout) {
        let start = self.bytes.len();
        if let Some(n) = append_header(header, layout, &mut self.bytes) {
            self.push_range(start, n);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.segs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_spec::tcp::{write_header, C2HData, CapsuleResp, Digests, PduType};
    use pollux_spec::Cqe;
    use zerocopy::IntoBytes;

    /// What `Tx` queues for a header is what `write_header` writes, with
    /// and without digests and padding.
    #[test]
    fn queued_header_bytes_match_write_header() {
        for dgst in 0..4 {
            let digests = Digests::from_dgst(dgst);
            for pda in [0, 1, 3, 31] {
                for len in [0, 1, 4096] {
                    let (h, l) = C2HData::new(7, 0, len.max(1), true, true, digests, pda).unwrap();
                    let r = CapsuleResp::new(Cqe::default(), digests.header);
                    let lr = PduLayout::new(PduType::CapsuleResp, digests, pda, 0).unwrap();
                    for (hdr, lay) in [(h.as_bytes(), l), (r.as_bytes(), lr)] {
                        let mut tx = Tx::default();
                        tx.push_header(hdr, &lay);
                        let mut want = [0u8; 256];
                        let n = write_header(hdr, &lay, &mut want).unwrap();
                        assert_eq!(tx.bytes, &want[..n], "{lay:?}");
                        assert_eq!(tx.pending().len(), 1);
                    }
                }
            }
        }
        // A header of the wrong length is refused.
        let l = PduLayout::new(PduType::CapsuleResp, Digests::NONE, 0, 0).unwrap();
        let mut tx = Tx::default();
        tx.push_header(&[0u8; 8], &l);
        assert!(tx.is_empty() && tx.bytes.is_empty());
    }

    /// The segment queue: bytes merge only into a pending segment; a
    /// drained queue starts over.
    #[test]
    fn tx_queue_merges_pending_bytes_and_restarts_when_drained() {
        let mut tx = Tx::default();
        tx.push_bytes(b"ab");
        tx.push_bytes(b"cd");
        assert_eq!(tx.pending().len(), 1);
        tx.push(Seg::Release { slot: 3 });
        tx.push_bytes(b"ef");
        assert_eq!(tx.pending().len(), 3);
        tx.pop_front();
        assert!(matches!(tx.front(), Some(Seg::Release { slot: 3 })));
        tx.pop_front();
        assert!(matches!(tx.front(), Some(Seg::Bytes { start: 4, len: 2 })));
        tx.pop_front();
        assert!(tx.is_empty() && tx.front().is_none());
        assert_eq!((tx.segs.len(), tx.head), (0, 0));
        // The sent "ef" is not extended: the new bytes are a new segment.
        tx.push_bytes(b"gh");
        assert_eq!(tx.pending().len(), 1);
        assert!(matches!(tx.front(), Some(Seg::Bytes { start: 6, len: 2 })));
    }
}
