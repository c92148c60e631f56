//! Send: what a connection has queued for the wire, as segments that
//! become the iovecs of one vectored send. PDU headers (with their
//! digests and padding), small data and data digests are copied into the
//! queue's own buffer; a command's data is referenced where it lies, by
//! address ([`Memory`]); a mark is reached once everything queued before
//! it has been sent (the target frees a slot's buffer there).
use std::io::IoSlice;

use pollux_spec::tcp::{append_header, PduLayout};

use crate::engine::memory::Memory;

/// One piece of the send stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seg {
    /// `len` bytes of the queue's own buffer from `start`.
    Own { start: usize, len: usize },
    /// `len` bytes at `addr` of the buffer of command slot `slot`;
    /// `mark`: a mark for `slot` is reached once they are sent (the last
    /// thing of the slot's, without a [`Seg::Mark`] of its own).
    Ext {
        addr: u64,
        len: usize,
        slot: u16,
        mark: bool,
    },
    /// Nothing to send; reached once all before it is sent.
    Mark { slot: u16 },
}

/// The send queue of one connection. See the module docs.
#[derive(Debug, Default)]
pub struct SendQueue {
    bytes: Vec<u8>,
    /// Segments; those before `first` are sent. Emptied (and `first`
    /// reset) when the last one is: a queue that drains, as a
    /// connection's does, needs no ring (a `Vec` and an index cost less
    /// per PDU than a `VecDeque`).
    segs: Vec<Seg>,
    first: usize,
    /// Bytes of the front segment already sent.
    head: usize,
}

impl SendQueue {
    pub fn with_capacity(bytes: usize) -> SendQueue {
        SendQueue {
            bytes: Vec::with_capacity(bytes),
            segs: Vec::new(),
            first: 0,
            head: 0,
        }
    }

    /// True if nothing is queued (marks included).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first == self.segs.len()
    }

    /// Bytes in the queue's own buffer (queued headers and copies).
    #[inline]
    pub fn own_len(&self) -> usize {
        self.bytes.len()
    }

    /// The segments not yet (fully) sent.
    pub fn segments(&self) -> impl Iterator<Item = &Seg> + '_ {
        self.pending().iter()
    }

    #[inline(always)]
    fn pending(&self) -> &[Seg] {
        &self.segs[self.first..]
    }

    /// Forgets everything queued.
    pub fn clear(&mut self) {
        self.segs.clear();
        self.bytes.clear();
        self.first = 0;
        self.head = 0;
    }

    /// Queues a copy of `b`.
    #[inline]
    pub fn push_bytes(&mut self, b: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.push_range(start, b.len());
    }

    /// Queues `bytes[start..start + len]`, just appended.
    #[inline]
    fn push_range(&mut self, start: usize, len: usize) {
        // Only an unsent segment is ever last (a drained queue is
        // emptied).
        if let Some(Seg::Own { start: s, len: l }) = self.segs.last_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
        self.segs.push(Seg::Own { start, len });
    }

    /// Queues a PDU header with its digest and the padding up to its data,
    /// per `layout` (nothing if `header` is not `layout.hlen` long).
    #[inline]
    pub fn push_header(&mut self, header: &[u8], layout: &PduLayout) {
        let start = self.bytes.len();
        if let Some(n) = append_header(header, layout, &mut self.bytes) {
            self.push_range(start, n);
        }
    }

    /// Queues `len` bytes at `addr` of slot `slot`'s buffer, sent from
    /// where they lie.
    #[inline]
    pub fn push_ext(&mut self, addr: u64, len: usize, slot: u16) {
        self.segs.push(Seg::Ext {
            addr,
            len,
            slot,
            mark: false,
        });
    }

    /// Queues `len` bytes at `addr` of slot `slot`'s buffer, then a mark
    /// for `slot`, in one segment (as [`push_ext`](Self::push_ext) then
    /// [`push_mark`](Self::push_mark), one segment fewer to queue, send and
    /// drop).
    #[inline]
    pub fn push_ext_marked(&mut self, addr: u64, len: usize, slot: u16) {
        self.segs.push(Seg::Ext {
            addr,
            len,
            slot,
            mark: true,
        });
    }

    /// Queues a mark for `slot`.
    #[inline]
    pub fn push_mark(&mut self, slot: u16) {
        self.segs.push(Seg::Mark { slot });
    }

    /// Fills `out` with the iovecs of what is queued (at most its length)
    /// and returns how many.
    ///
    /// # Safety
    /// Every `Ext` segment queued must name bytes of a live buffer that
    /// nothing writes until the iovecs are used (the buffer of an
    /// outstanding command).
    #[inline]
    pub unsafe fn iovecs<'s, M: Memory>(&'s self, mem: &M, out: &mut [IoSlice<'s>]) -> usize {
        let mut k = 0;
        for (i, s) in self.pending().iter().enumerate() {
            if k == out.len() {
                break;
            }
            let skip = if i == 0 { self.head } else { 0 };
            out[k] = match *s {
                Seg::Own { start, len } => IoSlice::new(&self.bytes[start + skip..start + len]),
                Seg::Ext { addr, len, .. } => {
                    // SAFETY: the caller's contract.
                    let b = unsafe { mem.bytes(addr + skip as u64, len - skip) };
                    IoSlice::new(b)
                }
                Seg::Mark { .. } => continue,
            };
            k += 1;
        }
        k
    }

    /// As [`iovecs`](Self::iovecs), but into `out` (cleared first, at
    /// most `max` entries) as raw `libc::iovec`s, which carry no lifetime:
    /// a caller that keeps the vector between sends (to spare allocating
    /// or zeroing one per send) gets them this way. Returns how many.
    ///
    /// # Safety
    /// As for [`iovecs`](Self::iovecs); and the iovecs are valid only
    /// until the queue or any buffer they name changes.
    #[inline]
    pub unsafe fn iovecs_raw<M: Memory>(
        &self,
        mem: &M,
        out: &mut Vec<libc::iovec>,
        max: usize,
    ) -> usize {
        out.clear();
        for (i, s) in self.pending().iter().enumerate() {
            if out.len() == max {
                break;
            }
            let skip = if i == 0 { self.head } else { 0 };
            let b: &[u8] = match *s {
                Seg::Own { start, len } => &self.bytes[start + skip..start + len],
                // SAFETY: the caller's contract.
                Seg::Ext { addr, len, .. } => unsafe { mem.bytes(addr + skip as u64, len - skip) },
                Seg::Mark { .. } => continue,
            };
            out.push(libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
        }
        out.len()
    }

    /// `sent` bytes of the queue went out: drops what is sent, reporting
    /// each mark reached (those at the front even when `sent` is 0) to
    /// `mark`. When all is sent, the buffer starts over.
    #[inline]
    pub fn advance(&mut self, mut sent: usize, mut mark: impl FnMut(u16)) {
        while let Some(&s) = self.segs.get(self.first) {
            let (len, marks) = match s {
                Seg::Own { len, .. } => (len, None),
                Seg::Ext {
                    len, slot, mark: m, ..
                } => (len, m.then_some(slot)),
                Seg::Mark { slot } => {
                    self.first += 1;
                    mark(slot);
                    continue;
                }
            };
            let left = len - self.head;
            if sent >= left {
                sent -= left;
                self.head = 0;
                self.first += 1;
                if let Some(slot) = marks {
                    mark(slot);
                }
            } else {
                self.head += sent;
                break;
            }
        }
        if self.first == self.segs.len() {
            self.segs.clear();
            self.first = 0;
            self.bytes.clear();
            self.head = 0;
        }
    }

    /// Copies the unsent bytes of slot `slot`'s buffer into the queue's own
    /// buffer, so nothing queued points at it any more (its command is
    /// about to complete).
    ///
    /// # Safety
    /// The `Ext` segments of `slot` must name bytes of a live buffer that
    /// nothing writes during the call.
    pub unsafe fn detach<M: Memory>(&mut self, slot: u16, mem: &M) {
        let mut i = self.first;
        while i < self.segs.len() {
            if let Seg::Ext {
                addr,
                len,
                slot: s,
                mark,
            } = self.segs[i]
            {
                if s != slot {
                    i += 1;
                    continue;
                }
                let skip = if i == self.first { self.head } else { 0 };
                let start = self.bytes.len();
                // SAFETY: the caller's contract.
                self.bytes
                    .extend_from_slice(unsafe { mem.bytes(addr + skip as u64, len - skip) });
                self.segs[i] = Seg::Own {
                    start,
                    len: len - skip,
                };
                if i == self.first {
                    self.head = 0;
                }
                if mark {
                    // Its mark, now a segment of its own, after it.
                    i += 1;
                    self.segs.insert(i, Seg::Mark { slot });
                }
            }
            i += 1;
        }
    }
}
