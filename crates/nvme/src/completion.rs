//! What a finished request hands back, and a queue pair's counters.
use crate::dma::IoBuf;
use crate::error::IoError;

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The value given at submission.
    pub user_data: u64,
    /// Completion dword 0 on success.
    pub result: Result<u32, IoError>,
    /// The owned buffer the request was submitted with, handed back.
    pub buf: Option<IoBuf>,
}

impl Completion {
    /// A completion without a buffer (what a request submitted with a
    /// borrowed buffer, or none, gets).
    pub fn new(user_data: u64, result: Result<u32, IoError>) -> Completion {
        Completion {
            user_data,
            result,
            buf: None,
        }
    }
}

/// Equal when user data and result are, and both carry no buffer or the
/// same piece of buffer.
impl PartialEq for Completion {
    fn eq(&self, o: &Completion) -> bool {
        self.user_data == o.user_data
            && self.result == o.result
            && match (&self.buf, &o.buf) {
                (None, None) => true,
                (Some(a), Some(b)) => a.same(b),
                _ => false,
            }
    }
}

/// Counters of one queue pair (plain integers: the queue pair has one owner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpairStats {
    /// Commands sent to the controller.
    pub submitted: u64,
    /// Completions consumed.
    pub completed: u64,
    /// SQ tail doorbell writes (MMIO).
    pub sq_doorbells: u64,
    /// CQ head doorbell writes (MMIO).
    pub cq_doorbells: u64,
    /// Shadow doorbell updates (memory writes instead of MMIO).
    pub shadow_updates: u64,
    pub polls: u64,
    /// Requests that had to wait in the software queue.
    pub queued: u64,
    pub timeouts: u64,
    pub aborts_sent: u64,
    pub resets_seen: u64,
    /// Completions the controller posted for a CID that was not outstanding.
    pub bogus_completions: u64,
    /// Owned buffers not handed back with their completions because the
    /// controller failed without stopping (`Controller::may_still_transfer`),
    /// and their bytes.
    pub withheld_buffers: u64,
    pub withheld_bytes: u64,
}
