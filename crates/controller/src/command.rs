//! An I/O command once checked (`IoQueue::check`): what it does and on
//! what, for the queue that runs it and the transport that moves its data.
use pollux_spec::cmd::RwFlags;

/// What a checked command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    /// Flush one namespace.
    Flush,
    /// Flush every namespace (NSID FFFFFFFFh).
    FlushAll,
    /// Write Zeroes; `dealloc`: DEAC set.
    WriteZeroes {
        dealloc: bool,
    },
    /// Dataset Management with `nr` ranges (the data);
    /// `deallocate`: AD set (else hints only).
    Dsm {
        nr: usize,
        deallocate: bool,
    },
}

/// A command that passed [`IoQueue::check`](crate::IoQueue::check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCmd {
    pub op: IoOp,
    /// The namespace (1-based; 0xFFFFFFFF for `FlushAll`).
    pub nsid: u32,
    pub slba: u64,
    /// Logical blocks (1's based).
    pub nlb: u64,
    /// Bytes of data the command moves (0: none).
    pub xfer_len: usize,
    /// A Read's, Write's or Write Zeroes' flags (Force Unit Access, which
    /// every write has while the volatile write cache is disabled); none
    /// for the others.
    pub flags: RwFlags,
    /// The command identifier, for the Error Information log: the SQE's
    /// from [`IoQueue::check_reported`](crate::IoQueue::check_reported),
    /// FFFFh ("not available") from [`IoQueue::check`](crate::IoQueue::check).
    pub cid: u16,
}

impl IoCmd {
    /// The data goes to the host (a read); else, when `xfer_len` is not
    /// 0, it comes from the host.
    #[inline(always)]
    pub fn to_host(&self) -> bool {
        self.op == IoOp::Read
    }
}

/// `[slba, slba + nlb)` inside a namespace of `nsze` blocks.
#[inline(always)]
pub(crate) fn lba_ok(slba: u64, nlb: u64, nsze: u64) -> bool {
    slba.checked_add(nlb).is_some_and(|end| end <= nsze)
}
