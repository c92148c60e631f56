//! Fault injection: rules that match commands by queue, opcode, NSID and LBA
//! range, and the set of *deferred* commands those rules create (delayed
//! completions and dropped commands).
//!
//! Rules are consulted only when at least one exists (one branch on the hot
//! path otherwise). They are evaluated in insertion order; a matching rule
//! still in its `skip` phase lets the command pass (and counts it), the first
//! rule that fires decides the action. Exhausted rules stay inert until
//! `clear_faults`.
//!
//! Deferred commands are bounded ([`DEFERRED_LIMIT`]): when the set is full
//! the controller stops fetching until some complete. A clock is read only
//! while at least one delayed completion is pending.
use std::ops::Range;
use std::time::{Duration, Instant};

use pollux_spec::{NvmOpcode, Sqe, Status};

use crate::config::DEFERRED_LIMIT;
use crate::queue::Completion;

/// Most fault rules installed at once.
pub const MAX_FAULT_RULES: usize = 256;

/// Which queues a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueSel {
    Admin,
    Io,
    Any,
}

/// What happens to a command a rule fires on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Complete with this status; no data is moved.
    Status(Status),
    /// Execute normally, post the completion no earlier than this.
    Delay(Duration),
    /// Never execute or complete it; Abort still finds it (then it completes
    /// with Command Abort Requested); SQ deletion and reset forget it.
    Drop,
    /// Execute normally, hold the completion and post it right after the
    /// next completion for the same CQ. Until then Abort finds it.
    Reorder,
    /// Set CSTS.CFS and stop processing every queue until CC.EN 1 -> 0.
    Fatal,
    /// Stop processing every queue, CSTS unchanged, until CC.EN 1 -> 0.
    Freeze,
}

/// A fault injection rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub queue: QueueSel,
    pub opcode: Option<u8>,
    pub nsid: Option<u32>,
    /// Matches I/O commands whose `[slba, slba + nlb)` intersects this.
    pub lba: Option<Range<u64>>,
    /// Let this many matching commands pass first.
    pub skip: u32,
    /// Then fire this many times (`None` = forever).
    pub count: Option<u32>,
    pub action: FaultAction,
}

impl FaultRule {
    /// A rule firing `action` forever on every command of `queue`.
    pub fn new(queue: QueueSel, action: FaultAction) -> Self {
        FaultRule {
            queue,
            opcode: None,
            nsid: None,
            lba: None,
            skip: 0,
            count: None,
            action,
        }
    }

    fn matches(&self, admin: bool, sqe: &Sqe) -> bool {
        let q = match self.queue {
            QueueSel::Admin => admin,
            QueueSel::Io => !admin,
            QueueSel::Any => true,
        };
        if !q
            || self.opcode.is_some_and(|o| o != sqe.opc)
            || self.nsid.is_some_and(|n| n != sqe.nsid)
        {
            return false;
        }
        match &self.lba {
            None => true,
            Some(r) => !admin && lba_range(sqe).is_some_and(|(s, e)| s < r.end && r.start < e),
        }
    }
}

/// `[slba, slba + nlb)` of an NVM command that carries one.
fn lba_range(sqe: &Sqe) -> Option<(u64, u64)> {
    use NvmOpcode::*;
    match NvmOpcode::from_u8(sqe.opc)? {
        Read | Write | WriteZeroes | Compare | Verify | WriteUncorrectable => {
            let s = sqe.slba();
            Some((s, s.saturating_add(sqe.nlb() as u64)))
        }
        _ => None,
    }
}

struct Armed {
    rule: FaultRule,
    skipped: u32,
    fired: u32,
}

/// The installed rules with their progress.
#[derive(Default)]
pub(crate) struct Faults {
    rules: Vec<Armed>,
}

impl Faults {
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn add(&mut self, rule: FaultRule) {
        if self.rules.len() >= MAX_FAULT_RULES {
            tracing::warn!(
                limit = MAX_FAULT_RULES,
                "too many fault rules; rule ignored"
            );
            return;
        }
        self.rules.push(Armed {
            rule,
            skipped: 0,
            fired: 0,
        });
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The action to apply to `sqe`, if a rule fires.
    #[cold]
    pub fn check(&mut self, admin: bool, sqe: &Sqe) -> Option<FaultAction> {
        for a in &mut self.rules {
            if a.rule.count.is_some_and(|c| a.fired >= c) || !a.rule.matches(admin, sqe) {
                continue;
            }
            if a.skipped < a.rule.skip {
                a.skipped += 1;
                continue;
            }
            a.fired += 1;
            return Some(a.rule.action.clone());
        }
        None
    }
}

/// Why a command is deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeferKind {
    Delayed(Instant),
    Dropped,
}

/// A command executed (or dropped) whose completion is not posted yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deferred {
    pub c: Completion,
    pub cqid: u16,
    pub kind: DeferKind,
    /// The command is an Abort (counts against the Abort Command Limit).
    pub is_abort: bool,
}

/// Bounded set of deferred commands.
#[derive(Default)]
pub(crate) struct DeferredSet {
    items: Vec<Deferred>,
    delayed: usize,
    next_due: Option<Instant>,
}

impl DeferredSet {
    #[inline(always)]
    pub fn is_full(&self) -> bool {
        self.items.len() >= DEFERRED_LIMIT
    }

    /// When the earliest delayed completion is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.next_due
    }

    /// Some delayed completion is pending (a clock read is needed).
    #[inline(always)]
    pub fn has_delayed(&self) -> bool {
        self.delayed != 0
    }

    pub fn push(&mut self, d: Deferred) {
        debug_assert!(!self.is_full());
        if let DeferKind::Delayed(t) = d.kind {
            self.delayed += 1;
            self.next_due = Some(self.next_due.map_or(t, |n| n.min(t)));
        }
        self.items.push(d);
    }

    fn recount(&mut self) {
        self.delayed = 0;
        self.next_due = None;
        for d in &self.items {
            if let DeferKind::Delayed(t) = d.kind {
                self.delayed += 1;
                self.next_due = Some(self.next_due.map_or(t, |n| n.min(t)));
            }
        }
    }

    /// Removes and returns (in deadline order) the delayed completions due
    /// at `now`.
    pub fn take_due(&mut self, now: Instant) -> Vec<Deferred> {
        match self.next_due {
            Some(t) if t <= now => {}
            _ => return Vec::new(),
        }
        let mut due = self.take_where(|d| matches!(d.kind, DeferKind::Delayed(t) if t <= now));
        due.sort_by_key(|d| match d.kind {
            DeferKind::Delayed(t) => t,
            DeferKind::Dropped => now,
        });
        due
    }

    /// Removes and returns every item matching `f`, keeping order.
    pub fn take_where(&mut self, mut f: impl FnMut(&Deferred) -> bool) -> Vec<Deferred> {
        let mut out = Vec::new();
        self.items.retain(|d| {
            if f(d) {
                out.push(*d);
                false
            } else {
                true
            }
        });
        if !out.is_empty() {
            self.recount();
        }
        out
    }

    /// Aborts in flight (deferred Abort commands).
    pub fn aborts(&self) -> usize {
        self.items.iter().filter(|d| d.is_abort).count()
    }

    pub fn clear(&mut self) {
        self.items.clear();
        self.recount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(slba: u64, nlb: u32) -> Sqe {
        Sqe::rw(NvmOpcode::Read, 1, slba, nlb)
    }

    #[test]
    fn skip_count_and_lba() {
        let mut f = Faults::default();
        f.add(FaultRule {
            lba: Some(100..200),
            skip: 1,
            count: Some(2),
            ..FaultRule::new(QueueSel::Io, FaultAction::Drop)
        });
        assert_eq!(f.check(false, &read(0, 8)), None);
        assert_eq!(f.check(false, &read(96, 8)), None); // skipped
        assert_eq!(f.check(true, &read(96, 8)), None); // admin
        assert_eq!(f.check(false, &read(199, 1)), Some(FaultAction::Drop));
        assert_eq!(f.check(false, &read(150, 1)), Some(FaultAction::Drop));
        assert_eq!(f.check(false, &read(150, 1)), None); // exhausted
        assert_eq!(f.check(false, &Sqe::flush(1)), None); // no LBA
    }
}
