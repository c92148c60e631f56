//! A request's slot: what it does, its buffers and what is left.

use pollux_spec::cmd::RwFlags;

use super::options::NO_BUF;
use crate::data::Data;

/// What a slot's request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Flush,
    /// fallocate(ZERO_RANGE).
    Zero,
    /// fallocate(PUNCH_HOLE).
    Punch,
    /// Zeroing by writes of the zero buffer.
    ZeroWrite,
    /// Reset: NOP with IO_DRAIN.
    Drain,
}

/// One iovec, laid out as `struct iovec` (but `Send`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Iov {
    pub(super) base: usize,
    pub(super) len: usize,
}

const _: () = assert!(
    std::mem::size_of::<Iov>() == std::mem::size_of::<libc::iovec>()
        && std::mem::align_of::<Iov>() == std::mem::align_of::<libc::iovec>()
);

pub(super) struct Slot {
    pub(super) busy: bool,
    pub(super) op: Op,
    /// The fixed buffer index of `addr` (NO_BUF: plain).
    pub(super) buf_index: u16,
    /// The transfer is the iovec array (else `addr`, `left`).
    pub(super) vec: bool,
    /// A write with RWF_DSYNC (Force Unit Access).
    pub(super) dsync: bool,
    /// A FUA read's first step: `fdatasync` before the read.
    pub(super) sync_first: bool,
    pub(super) ud: u64,
    /// File offset of the next SQE.
    pub(super) off: u64,
    /// Bytes still to transfer or zero.
    pub(super) left: u64,
    /// Bytes the request carries.
    pub(super) total: u64,
    /// Next byte of a one-buffer transfer.
    pub(super) addr: u64,
    /// First iovec not yet transferred.
    pub(super) iov_at: usize,
    pub(super) iov: Vec<Iov>,
    pub(super) data: Data,
}

impl Slot {
    pub(super) fn new() -> Slot {
        Slot {
            busy: false,
            op: Op::Drain,
            buf_index: NO_BUF,
            vec: false,
            dsync: false,
            sync_first: false,
            ud: 0,
            off: 0,
            left: 0,
            total: 0,
            addr: 0,
            iov_at: 0,
            iov: Vec::new(),
            data: Data::None,
        }
    }

    /// Force Unit Access as `flags` say, for a read or a write.
    #[inline(always)]
    pub(super) fn set_fua(&mut self, write: bool, flags: RwFlags) {
        let fua = flags.fua();
        self.dsync = fua && write;
        self.sync_first = fua && !write;
    }

    /// `n` more bytes went through.
    pub(super) fn advance(&mut self, n: u64) {
        self.off += n;
        self.left -= n;
        if !self.vec {
            self.addr += n;
            return;
        }
        let mut n = n as usize;
        while n > 0 && self.iov_at < self.iov.len() {
            let v = &mut self.iov[self.iov_at];
            if n >= v.len {
                n -= v.len;
                self.iov_at += 1;
            } else {
                v.base += n;
                v.len -= n;
                n = 0;
            }
        }
    }
}
