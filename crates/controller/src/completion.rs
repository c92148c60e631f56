//! What `IoQueue::poll` makes of a finished bdev request: the command's
//! status, counted for SMART, a failure logged and reported (`Report`);
//! an NVMe namespace's staged pieces taken back first (`poll_staged`).
//! Also the counts and failure status of reads and writes that end within
//! `IoQueue::start` (`count`, `rw_failed`).
use pollux_bdev::{Completion, Io, IoError};
use pollux_spec::log::ERROR_LOG_NOT_SPECIFIC;
use pollux_spec::status::media;
use pollux_spec::Status;

use crate::command::IoCmd;
use crate::stats::{IoErrorRecord, IoStats, Registry};
use crate::store::{NsChan, StoreError};
use crate::user_data::{Kind, UserData, KID};

/// `IoQueue::poll` of an NVMe namespace's channel: staged pieces come
/// back (a command's status once its last piece is in), then waiting
/// commands start if pieces allow.
pub(crate) fn poll_staged(
    ns: &mut NsChan,
    stats: &mut IoStats,
    rep: &Report<'_>,
    nsid: u32,
    f: &mut impl FnMut(u32, Status),
) -> usize {
    let shift = ns.shift;
    let NsChan { ch, staging, .. } = ns;
    let Some(st) = staging else {
        return 0;
    };
    let mut n = 0;
    if ch.outstanding() > 0 {
        ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
            let u = UserData::from_raw(c.user_data);
            let (u, r) = if u.is_part() {
                // SAFETY: `IoQueue::submit`'s contract holds for the
                // command until this delivers it.
                match unsafe { st.complete(c) } {
                    Some(done) => done,
                    None => return,
                }
            } else {
                (u, c.result)
            };
            f(u.tag(), finish(stats, rep, nsid, shift, u, r));
            n += 1;
        });
    }
    if st.waiting() > 0 {
        let mut io = ch.io();
        // SAFETY: as above, for the waiting commands.
        unsafe {
            st.resume(&mut io, &mut |(u, r)| {
                f(u.tag(), finish(stats, rep, nsid, shift, u, r));
                n += 1;
            })
        };
        ch.flush();
    }
    n
}

/// Where `poll` reports failed commands (see `IoQueue::report_errors`).
pub(crate) struct Report<'a> {
    pub registry: &'a Registry,
    pub sqid: Option<u16>,
    pub info: &'a [(u16, u64)],
}

/// The status of a finished asynchronous request, counted.
#[inline]
pub(crate) fn finish(
    stats: &mut IoStats,
    rep: &Report<'_>,
    nsid: u32,
    shift: u32,
    u: UserData,
    r: Result<u32, IoError>,
) -> Status {
    match r {
        Ok(_) => {
            if u.is(Kind::Read) {
                stats.reads += 1;
                stats.bytes_read += u.blocks() << shift;
            } else if u.is(Kind::Write) {
                stats.writes += 1;
                stats.bytes_written += u.blocks() << shift;
            }
            Status::SUCCESS
        }
        Err(e) => failed(rep, nsid, u, &e),
    }
}

/// The status of a failed asynchronous request, logged and reported.
#[cold]
#[inline(never)]
fn failed(rep: &Report<'_>, nsid: u32, u: UserData, e: &IoError) -> Status {
    let tag = u.tag();
    tracing::error!(nsid, tag, error = %e, "namespace I/O failed");
    let st = Status::media(if u.is(Kind::Read) {
        media::UNRECOVERED_READ_ERROR
    } else {
        media::WRITE_FAULT
    });
    // A piece of a multi-request command: the command is reported once
    // it is over (`multi`).
    if let Some(sqid) = rep.sqid.filter(|_| tag & KID == 0) {
        let (cid, lba) = rep
            .info
            .get(tag as usize)
            .copied()
            .unwrap_or((ERROR_LOG_NOT_SPECIFIC, 0));
        rep.registry.push_error(IoErrorRecord {
            sqid,
            cid,
            status: st,
            nsid,
            lba,
        });
    }
    st
}

/// Counts a successful read or write of `bytes`.
#[inline(always)]
pub(crate) fn count(stats: &mut IoStats, write: bool, bytes: usize) {
    if write {
        stats.writes += 1;
        stats.bytes_written += bytes as u64;
    } else {
        stats.reads += 1;
        stats.bytes_read += bytes as u64;
    }
}

/// The status of a failed read or write, logged. (Reported to the
/// controller by `submit` when the queue reports errors; the emulator
/// accounts it at completion: `Controller::note_error`.)
#[cold]
#[inline(never)]
pub(crate) fn rw_failed(cmd: &IoCmd, write: bool, e: &StoreError) -> Status {
    let (slba, nlb) = (cmd.slba, cmd.nlb);
    tracing::error!(nsid = cmd.nsid, slba, nlb, write, error = %e, "namespace I/O failed");
    Status::media(if write {
        media::WRITE_FAULT
    } else {
        media::UNRECOVERED_READ_ERROR
    })
}
