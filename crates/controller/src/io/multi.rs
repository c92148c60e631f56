//! Commands an I/O queue runs as several bdev requests, a bounded amount
//! at a time (`IoQueue::exec` polls until they are over): Dataset
//! Management (a deallocate per range), Write Zeroes over more blocks than
//! one request of its namespace covers (`NsChan::zero_piece`) or with
//! Force Unit Access (a flush of its namespace once every piece is back),
//! and Flush of every namespace (NSID FFFFFFFFh).
//!
//! None of them runs to completion within `IoQueue::submit` or
//! `IoQueue::poll`: a command has at most one request in flight per
//! namespace (a flush of every namespace one on each, the others one in
//! all), and its next piece goes out when the previous one is polled
//! back. So a whole-namespace deallocate on a slow backend holds the
//! queue's thread no longer than a read does, each poll does at most one
//! piece of each such command, and the namespaces' channels never hold
//! more requests than the queue has commands (their depth).
//!
//! Their requests carry tags with [`KID`] set and the command's slot here
//! below it; `IoQueue::poll` hands them here (only while some such
//! command is outstanding: the read/write path pays one test per poll).
//! A command completes once its last request is back: with success, or,
//! if a request failed or was refused (the rest are then not sent), with
//! its kind's failure: Internal Error for Dataset Management, Write Fault
//! for the others.
use pollux_bdev::RawSeg as Seg;
use pollux_spec::cmd::DsmRange;
use pollux_spec::status::{generic, media};
use pollux_spec::Status;
use zerocopy::FromBytes;

use crate::command::{lba_ok, IoCmd, IoOp};
use crate::cursor::copy_from_segs;
use crate::store::NsChan;
use crate::user_data::{Kind, UserData, KID};

#[inline(always)]
fn gen(sc: u8) -> Status {
    Status::generic(sc)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Flush each namespace of `todo`.
    Flush,
    /// Zero (`dealloc`: deallocate) each range of `todo`.
    Zero { dealloc: bool },
}

/// One command.
struct Multi {
    tag: u32,
    cid: u16,
    nsid: u32,
    slba: u64,
    work: Work,
    /// What is left to send: (namespace index, first block, blocks), the
    /// next one last.
    todo: Vec<(usize, u64, u64)>,
    /// The namespace (index) to flush once every piece is back (a Write
    /// Zeroes with FUA), until that flush is sent.
    then_flush: Option<usize>,
    /// Requests in flight.
    out: u32,
    /// A request failed or was refused: nothing more is sent.
    failed: bool,
    /// The status it then completes with.
    fail: Status,
}

impl Multi {
    fn status(&self) -> Status {
        if self.failed {
            self.fail
        } else {
            Status::SUCCESS
        }
    }
}

/// The commands of one queue, by slot (no more than the queue's depth:
/// each is one of its outstanding commands).
#[derive(Default)]
pub(crate) struct Multis {
    slots: Vec<Option<Multi>>,
    free: Vec<u32>,
    live: usize,
    /// Completions of their requests met by a poll (kept for reuse).
    pub kids: Vec<(u32, Status)>,
}

/// A command that is over ([`Multis::kid_done`]).
pub(crate) struct Over {
    pub tag: u32,
    pub cid: u16,
    pub nsid: u32,
    pub slba: u64,
    pub status: Status,
}

impl Multis {
    /// No such command is outstanding.
    #[inline(always)]
    pub fn idle(&self) -> bool {
        self.live == 0
    }

    fn insert(&mut self, m: Multi) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(m);
                i as usize
            }
            None => {
                self.slots.push(Some(m));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Option<Multi> {
        let m = self.slots.get_mut(i)?.take()?;
        self.live -= 1;
        self.free.push(i as u32);
        Some(m)
    }
}

impl Multis {
    /// `IoQueue::start` of a Dataset Management, a Flush of every
    /// namespace or a Write Zeroes larger than one piece, over the queue's
    /// namespaces `ns` (`scratch`: room for the ranges): its status if it
    /// ends within the call (nothing to do, refused), else None (`poll`
    /// delivers it).
    ///
    /// # Safety
    /// As `IoQueue::submit` (a Dataset Management's ranges are read within
    /// the call).
    pub unsafe fn start(
        &mut self,
        ns: &mut [Option<NsChan>],
        scratch: &mut Vec<u8>,
        tag: u32,
        cmd: &IoCmd,
        segs: &[Seg],
    ) -> Option<Status> {
        debug_assert!(tag & KID == 0, "tag {tag:#x} has the multi-request bit");
        let idx = (cmd.nsid as usize).wrapping_sub(1);
        let mut then_flush = None;
        let (work, fail, todo) = match cmd.op {
            IoOp::FlushAll => (
                Work::Flush,
                Status::media(media::WRITE_FAULT),
                (0..ns.len())
                    .rev()
                    .filter(|&i| ns[i].is_some())
                    .map(|i| (i, 0, 0))
                    .collect(),
            ),
            IoOp::WriteZeroes { dealloc } if ns.get(idx).is_some_and(Option::is_some) => {
                then_flush = cmd.flags.fua().then_some(idx);
                (
                    Work::Zero { dealloc },
                    Status::media(media::WRITE_FAULT),
                    vec![(idx, cmd.slba, cmd.nlb)],
                )
            }
            IoOp::Dsm { nr, deallocate } => {
                // SAFETY: forwarded contract.
                match unsafe { dsm_ranges(ns, scratch, cmd.nsid, nr, deallocate, segs) } {
                    Ok(todo) => (
                        Work::Zero { dealloc: true },
                        gen(generic::INTERNAL_ERROR),
                        todo,
                    ),
                    Err(st) => return Some(st),
                }
            }
            _ => return Some(gen(generic::INVALID_NAMESPACE)),
        };
        if todo.is_empty() && then_flush.is_none() {
            return Some(Status::SUCCESS);
        }
        let slot = self.insert(Multi {
            tag,
            cid: cmd.cid,
            nsid: cmd.nsid,
            slba: cmd.slba,
            work,
            todo,
            then_flush,
            out: 0,
            failed: false,
            fail,
        });
        self.pump(ns, slot).map(|m| m.status())
    }

    /// Sends what command `slot` may have in flight now; returns it once
    /// it is over (and forgets it).
    fn pump(&mut self, ns: &mut [Option<NsChan>], slot: usize) -> Option<Multi> {
        let m = self.slots.get_mut(slot)?.as_mut()?;
        let kid = UserData::new(KID | slot as u32, Kind::Other, 0).raw();
        while !m.failed && (m.out == 0 || m.work == Work::Flush) {
            let Some(&(i, slba, nlb)) = m.todo.last() else {
                // Every piece is back: the flush that makes them durable.
                if m.out > 0 {
                    break;
                }
                let Some(i) = m.then_flush.take() else {
                    break;
                };
                let Some(n) = ns.get_mut(i).and_then(Option::as_mut) else {
                    m.failed = true;
                    break;
                };
                match n.ch.flush_cache(kid) {
                    Ok(()) => m.out += 1,
                    Err(e) => {
                        tracing::error!(nsid = i + 1, error = %e, "flush after write zeroes refused");
                        m.failed = true;
                    }
                }
                continue;
            };
            let Some(n) = ns.get_mut(i).and_then(Option::as_mut) else {
                m.failed = true;
                break;
            };
            let r = match m.work {
                Work::Flush => {
                    m.todo.pop();
                    n.ch.flush_cache(kid)
                }
                Work::Zero { dealloc } => {
                    let piece = nlb.min(n.zero_piece);
                    if piece == nlb {
                        m.todo.pop();
                    } else if let Some(last) = m.todo.last_mut() {
                        *last = (i, slba + piece, nlb - piece);
                    }
                    if dealloc {
                        n.ch.unmap(slba, piece, kid)
                    } else {
                        n.ch.write_zeroes(slba, piece, kid)
                    }
                }
            };
            match r {
                Ok(()) => m.out += 1,
                Err(e) => {
                    tracing::error!(nsid = i + 1, slba, nlb, work = ?m.work, error = %e, "namespace request refused");
                    m.failed = true;
                }
            }
        }
        let more = !m.todo.is_empty() || m.then_flush.is_some();
        if m.out > 0 || (!m.failed && more) {
            return None;
        }
        self.remove(slot)
    }

    /// The completion of request `tag` (with [`KID`]) of one of these
    /// commands with `st`: its next pieces go out; the command once it is
    /// over.
    pub fn kid_done(&mut self, ns: &mut [Option<NsChan>], tag: u32, st: Status) -> Option<Over> {
        let slot = (tag & !KID) as usize;
        match self.slots.get_mut(slot).and_then(Option::as_mut) {
            Some(m) => {
                m.out -= 1;
                m.failed |= !st.is_success();
            }
            None => {
                tracing::error!(tag, "completion of an unknown multi-request command");
                return None;
            }
        }
        let m = self.pump(ns, slot)?;
        Some(Over {
            tag: m.tag,
            cid: m.cid,
            nsid: m.nsid,
            slba: m.slba,
            status: m.status(),
        })
    }
}

/// A Dataset Management's ranges to deallocate, as `todo` (none for
/// hints only); LBA Out of Range if any range is outside the
/// namespace (then nothing is touched).
///
/// # Safety
/// As `IoQueue::exec`.
unsafe fn dsm_ranges(
    ns: &[Option<NsChan>],
    scratch: &mut Vec<u8>,
    nsid: u32,
    nr: usize,
    deallocate: bool,
    segs: &[Seg],
) -> Result<Vec<(usize, u64, u64)>, Status> {
    let idx = (nsid as usize).wrapping_sub(1);
    let Some(ns) = ns.get(idx).and_then(Option::as_ref) else {
        return Err(gen(generic::INVALID_NAMESPACE));
    };
    let nsze = ns.nsze;
    let len = nr * core::mem::size_of::<DsmRange>();
    scratch.clear();
    scratch.resize(len, 0);
    // SAFETY: forwarded contract.
    unsafe { copy_from_segs(segs, scratch) };
    let ranges = scratch
        .chunks_exact(16)
        .filter_map(|b| DsmRange::read_from_bytes(b).ok());
    if ranges.clone().any(|r| !lba_ok(r.slba, r.nlb as u64, nsze)) {
        return Err(gen(generic::LBA_OUT_OF_RANGE));
    }
    if !deallocate {
        return Ok(Vec::new()); // hints only
    }
    // Sent in the host's order: the last range first in the list.
    let mut todo: Vec<_> = ranges
        .filter(|r| r.nlb > 0)
        .map(|r| (idx, r.slba, r.nlb as u64))
        .collect();
    todo.reverse();
    Ok(todo)
}
