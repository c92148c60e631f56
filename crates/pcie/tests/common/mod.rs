//! Borrowed-buffer submission for tests.
//!
//! The tests submit many requests into slices of one `DmaBuffer` and look
//! at the buffer once they have drained: the `unsafe` borrowed-buffer API
//! (`read_dma`, `write_dma`, `raw_dma`) with its contract kept by every
//! test: a buffer stays alive, and is neither read nor written by the
//! test, until every request on it has completed (drained). The safe owned
//! API (`IoBuf`) has tests of its own (pollux-softnvme's
//! `tests/pcie_owned_buffers.rs`).
#![allow(dead_code)]
use pollux_pcie::{DmaSlice, Namespace, Pcie, QueuePair, SubmitError, Submitter};
use pollux_spec::Sqe;

/// Submission with a borrowed buffer, for queue pairs and submitters.
pub trait Borrowed {
    fn read_b(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        ud: u64,
    ) -> Result<(), SubmitError>;
    fn write_b(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        ud: u64,
    ) -> Result<(), SubmitError>;
    fn raw_b(&mut self, sqe: Sqe, data: Option<DmaSlice<'_>>, ud: u64) -> Result<(), SubmitError>;
}

macro_rules! borrowed {
    ($t:ty) => {
        impl Borrowed for $t {
            fn read_b(
                &mut self,
                ns: &Namespace,
                lba: u64,
                nlb: u32,
                buf: DmaSlice<'_>,
                ud: u64,
            ) -> Result<(), SubmitError> {
                // SAFETY: the tests keep the contract (module docs).
                unsafe { self.read_dma(ns, lba, nlb, buf, ud) }
            }
            fn write_b(
                &mut self,
                ns: &Namespace,
                lba: u64,
                nlb: u32,
                buf: DmaSlice<'_>,
                ud: u64,
            ) -> Result<(), SubmitError> {
                // SAFETY: the tests keep the contract (module docs).
                unsafe { self.write_dma(ns, lba, nlb, buf, ud) }
            }
            fn raw_b(
                &mut self,
                sqe: Sqe,
                data: Option<DmaSlice<'_>>,
                ud: u64,
            ) -> Result<(), SubmitError> {
                // SAFETY: the tests keep the contract (module docs).
                unsafe { self.raw_dma(sqe, data, ud) }
            }
        }
    };
}

borrowed!(QueuePair);
borrowed!(Submitter<'_>);

/// Keeps `Pcie` named (the queue pair type is `QueuePair<Pcie>`).
pub type Transport = Pcie;
