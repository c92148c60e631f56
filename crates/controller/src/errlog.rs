//! The Error Information log: a ring of the most recent errors (failed
//! commands, invalid doorbell writes), returned newest first by Get Log Page.
//!
//! Every failed command adds an entry; the error count is unique and
//! increasing (never 0, per spec). The ring keeps the last [`ERROR_LOG_ENTRIES`]
//! and the total count feeds the SMART "Number of Error Information Log
//! Entries" counter.
use std::collections::VecDeque;

use pollux_spec::log::{ErrorLogEntry, ERROR_LOG_NOT_SPECIFIC};
use pollux_spec::Status;
use zerocopy::IntoBytes;

/// Entries kept (Identify ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;

#[derive(Default)]
pub struct ErrorLog {
    ring: VecDeque<ErrorLogEntry>,
    count: u64,
}

impl ErrorLog {
    /// Records one error. `sqid`/`cid` are `ERROR_LOG_NOT_SPECIFIC` when
    /// the error is not tied to a command.
    pub fn record(&mut self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        self.count += 1;
        if self.ring.len() == ERROR_LOG_ENTRIES {
            self.ring.pop_front();
        }
        let mut e = ErrorLogEntry {
            error_count: self.count,
            sqid,
            cid,
            parameter_error_location: ERROR_LOG_NOT_SPECIFIC,
            lba,
            nsid,
            ..Default::default()
        };
        e.set_status(status, false);
        self.ring.push_back(e);
        debug_assert!(self.ring.len() <= ERROR_LOG_ENTRIES);
    }

    /// Counts `n` errors whose entries are not kept (older than what the
    /// ring holds).
    pub fn skip(&mut self, n: u64) {
        self.count += n;
    }

    /// Total errors recorded since the device was created.
    pub fn total(&self) -> u64 {
        self.count
    }

    /// The log page bytes: newest entry first, then zeroed entries.
    pub fn page(&self) -> Vec<u8> {
        let mut out = vec![0u8; ERROR_LOG_ENTRIES * 64];
        for (chunk, e) in out.chunks_exact_mut(64).zip(self.ring.iter().rev()) {
            chunk.copy_from_slice(e.as_bytes());
        }
        out
    }
}
