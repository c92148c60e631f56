//! Asynchronous events: outstanding Asynchronous Event Request commands
//! (at most AERL + 1), events waiting for one, and per-type masking.
//!
//! Once an event of a type is reported, further events of that type are
//! masked until the host reads the associated log page with RAE cleared
//! (spec §5.2). Notices are masked each on its own, by their log page (as
//! Linux's nvmet does): a Namespace Attribute Changed notice waiting for
//! its log to be read does not hide an ANA Change. Pending events are bounded; extra ones are dropped (logged).
use std::collections::VecDeque;

use pollux_spec::features::aer;
use pollux_spec::log::lid;

/// Most events waiting for an AER command.
pub const PENDING_EVENTS_LIMIT: usize = 16;

#[derive(Default)]
pub struct AerState {
    /// CIDs of outstanding AER commands (admin SQ), oldest first.
    pub outstanding: VecDeque<u16>,
    /// Completion DW0 of events not yet reported.
    pub pending: VecDeque<u32>,
    /// Bit `t` set: event type `t` is masked until its log is read;
    /// notices have bits of their own (`mask_bit`).
    masked: u16,
}

/// The mask bit of an event: its type, or for a notice one of its own.
fn mask_bit(event_type: u8, info: u8) -> u16 {
    if event_type == aer::NOTICE {
        match info {
            aer::NOTICE_NS_ATTR_CHANGED => 1 << 8,
            aer::NOTICE_ANA_CHANGE => 1 << 9,
            _ => 1 << aer::NOTICE,
        }
    } else {
        1 << (event_type & 7)
    }
}

impl AerState {
    /// Queues an event unless its type is masked.
    pub fn raise(&mut self, event_type: u8, info: u8, log_page: u8) {
        let bit = mask_bit(event_type, info);
        if self.masked & bit != 0 {
            tracing::debug!(event_type, info, "asynchronous event masked");
            return;
        }
        if self.pending.len() >= PENDING_EVENTS_LIMIT {
            tracing::warn!(
                event_type,
                info,
                "too many pending asynchronous events; dropped"
            );
            return;
        }
        self.masked |= bit;
        self.pending
            .push_back(aer::encode(event_type, info, log_page));
    }

    /// Unmasks the event type tied to log page `log` (read with RAE = 0).
    pub fn log_read(&mut self, log: u8) {
        let bit = match log {
            lid::ERROR => mask_bit(aer::ERROR, 0),
            lid::SMART => mask_bit(aer::SMART, 0),
            lid::CHANGED_NS_LIST => mask_bit(aer::NOTICE, aer::NOTICE_NS_ATTR_CHANGED),
            lid::ANA => mask_bit(aer::NOTICE, aer::NOTICE_ANA_CHANGE),
            _ => return,
        };
        self.masked &= !bit;
    }

    /// Next (AER CID, DW0) pair to complete, if both are available.
    pub fn next(&mut self) -> Option<(u16, u32)> {
        if self.outstanding.is_empty() || self.pending.is_empty() {
            return None;
        }
        let cid = self.outstanding.pop_front()?;
        let dw0 = self.pending.pop_front()?;
        Some((cid, dw0))
    }

    /// Forgets everything (controller reset).
    pub fn reset(&mut self) {
        *self = AerState::default();
    }
}
