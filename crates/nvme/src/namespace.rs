//! A namespace as the submit path sees it: its ID, block size, size,
//! split limit and the controller it belongs to.

/// A namespace as the I/O path needs it. Small and `Copy`: pass it by
/// reference to every submit call.
///
/// Only the controller makes one (from Identify Namespace at bring-up), and
/// its fields are read-only: the submit path computes the transfer length
/// of a read or write from the block size (`lba_shift`), so a namespace
/// whose block size could be changed would let the controller transfer
/// past the buffer (a 4 KiB buffer read with `lba_shift` forged to 9 on a
/// namespace of 4 KiB blocks: eight times its length):
///
/// ```compile_fail
/// # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
/// let mut ns = ctrl.namespaces()[0];
/// ns.lba_shift = 9; // error[E0616]: field `lba_shift` of struct `Namespace` is private
/// # }
/// ```
///
/// ```compile_fail
/// // error: cannot construct `Namespace` with struct literal syntax due to private fields
/// let ns = pollux_nvme::Namespace { nsid: 1, lba_shift: 9, nsze: 1 << 20, max_lbas: 8 };
/// ```
///
/// A namespace also names the controller it came from: a queue pair
/// refuses a namespace of another controller
/// ([`SubmitError::ForeignNamespace`](crate::SubmitError::ForeignNamespace)),
/// whose namespace of the same NSID may have another block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Namespace {
    pub(crate) nsid: u32,
    /// log2 of the LBA size.
    pub(crate) lba_shift: u8,
    /// Size in logical blocks.
    pub(crate) nsze: u64,
    /// Most LBAs one command may carry (from MDTS, capped at 2 MiB).
    pub(crate) max_lbas: u32,
    /// The controller it belongs to (`Shared::id`).
    pub(crate) ctrl: u64,
}

impl Namespace {
    /// Namespace ID.
    #[inline(always)]
    pub fn nsid(&self) -> u32 {
        self.nsid
    }
    /// log2 of the logical block size.
    #[inline(always)]
    pub fn lba_shift(&self) -> u8 {
        self.lba_shift
    }
    /// Size in logical blocks (NSZE).
    #[inline(always)]
    pub fn nsze(&self) -> u64 {
        self.nsze
    }
    /// Most logical blocks one command may carry (from MDTS, capped at
    /// 2 MiB); larger requests are split.
    #[inline(always)]
    pub fn max_lbas(&self) -> u32 {
        self.max_lbas
    }
    /// Logical block size in bytes.
    #[inline(always)]
    pub fn lba_size(&self) -> u32 {
        1 << self.lba_shift
    }
    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.nsze << self.lba_shift
    }
}
