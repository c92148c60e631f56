//! Asynchronous reads and writes of an NVMe namespace (a `Bdev` over
//! a real transport), staged through DMA bounce pieces: the NVMe bdev
//! takes only its controller's DMA memory (`IoBuf`s), never lent host
//! memory.
//!
//! Each queue's channel to such a namespace owns a pool of pieces cut
//! once, at queue creation, from one DMA allocation: size classes of
//! `block << k` bytes up to [`STAGE_CHUNK`] (or the largest transfer),
//! about [`CLASS_BYTES`] per class and never more than `depth` pieces of
//! one class; nothing is allocated per command. A command takes a record
//! (one of `depth`), then pieces for its transfer, largest first (a
//! power-of-two number of blocks each, falling back to smaller pieces
//! when a class is empty, at most [`MAX_PARTS`] of them); each piece is
//! one bdev request under the command's record (`user_data`: the record,
//! `Kind::Part`, the piece's offset). A write's data is gathered from the
//! host segments at submission; a read's is scattered into them when its
//! piece completes, so the record keeps the segments (up to
//! [`HOST_SEGS`] of them, copied: the caller's segment list itself need
//! not outlive the call). The command's status is delivered once every
//! piece has finished: success, or the first error (any failed piece
//! fails the command). Each piece carries the command's flags: a FUA
//! write's pieces are each durable before they complete, so the command
//! is once its status is delivered.
//!
//! When the pool cannot cover a command it waits, in order, for pieces to
//! come back (commands behind it wait too); it is started by the next
//! poll that finds enough. A command the whole pool could not cover in
//! [`MAX_PARTS`] pieces, or with more than [`HOST_SEGS`] segments, is not
//! staged (the caller runs it synchronously), so a waiting command always
//! starts once the requests in flight are done: none waits forever. If
//! nothing is in flight and the head still does not fit (pieces lost to a
//! broken backend), it fails instead of waiting.
//!
//! While a request is in flight its piece is owned by the bdev channel:
//! no safe slice of DMA memory under I/O exists. The host segments are
//! raw pointers under `IoQueue::submit`'s contract (valid until the
//! command's status has been delivered or the queue dropped).
use std::collections::VecDeque;

use pollux_bdev::{Bdev, Completion, Data, Io, IoBuf, IoError, RawSeg as Seg, SubmitError};
use pollux_spec::cmd::RwFlags;

use crate::cursor::Cursor;
use crate::user_data::{Kind, UserData};

/// Largest piece (bytes; smaller when the largest transfer is).
pub(crate) const STAGE_CHUNK: usize = 128 << 10;
/// Memory of one size class, roughly (see [`Staging::new`]).
pub(crate) const CLASS_BYTES: usize = 512 << 10;
/// Largest command the pool must be able to cover at once (bytes); larger
/// ones run synchronously.
pub(crate) const MAX_STAGED: usize = 1 << 20;
/// Pieces (bdev requests) of one command at most.
pub(crate) const MAX_PARTS: usize = 16;
/// Host segments a staged command may have (more: synchronous).
pub(crate) const HOST_SEGS: usize = 4;

/// The host segments of a staged command, copied.
#[derive(Clone, Copy)]
struct HostSegs {
    n: usize,
    s: [Seg; HOST_SEGS],
}

// SAFETY: the pointers are only dereferenced by the queue that holds
// them, under `IoQueue::submit`'s contract (the memory stays valid and
// untouched by anyone else until the command is delivered or the queue is
// dropped); moving the queue to another thread changes neither.
unsafe impl Send for HostSegs {}

impl HostSegs {
    const EMPTY: HostSegs = HostSegs {
        n: 0,
        s: [Seg {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; HOST_SEGS],
    };

    fn segs(&self) -> &[Seg] {
        &self.s[..self.n]
    }
}

/// One staged command.
struct Slot {
    tag: u32,
    write: bool,
    /// Force Unit Access, for every piece.
    flags: RwFlags,
    slba: u64,
    nlb: u64,
    segs: HostSegs,
    /// Pieces in flight.
    parts: u32,
    /// The first failure of a piece.
    err: Option<IoError>,
}

/// What became of a command handed to [`Staging::submit`].
pub(crate) enum Staged {
    /// In flight or waiting for pieces: its status comes from a poll.
    Queued,
    /// Refused before anything was sent (the status is the caller's).
    Failed(SubmitError),
}

/// What [`Staging::start`] did.
enum Start {
    Sent,
    /// Not enough pieces now.
    NoRoom,
    Failed(SubmitError),
}

/// A finished staged command: the `user_data` `IoQueue::poll` decodes
/// (tag, kind, blocks) and the result.
pub(crate) type Finished = (UserData, Result<u32, IoError>);

/// One queue's staging for one NVMe namespace (see the module doc).
pub(crate) struct Staging {
    shift: u32,
    /// `free[k]`: idle pieces of `block << k` bytes.
    free: Vec<Vec<IoBuf>>,
    /// Pieces of each class (for the checks).
    count: Vec<usize>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Commands waiting for pieces, oldest first.
    waiting: VecDeque<u32>,
    /// Pieces in bdev requests.
    in_flight: u32,
    /// Commands that had to wait for pieces, in all.
    waits: u64,
}

impl Staging {
    /// A pool for `depth` commands of at most `max_xfer` bytes on `bdev`.
    pub fn new(bdev: &Bdev, depth: u32, max_xfer: usize) -> Result<Staging, pollux_bdev::Error> {
        let shift = bdev.info().block_shift();
        let block = 1usize << shift;
        let chunk = STAGE_CHUNK.min(max_xfer).max(block);
        let top = (chunk >> shift).ilog2() as usize;
        let depth = depth.max(1) as usize;
        // Per class about CLASS_BYTES, at most `depth` pieces; the top
        // class also covers one command of the largest staged size.
        let biggest = max_xfer.min(MAX_STAGED).max(block);
        let mut count: Vec<usize> = (0..=top)
            .map(|k| (CLASS_BYTES >> (shift as usize + k)).clamp(1, depth))
            .collect();
        count[top] = count[top].max(biggest.div_ceil(block << top).min(MAX_PARTS));
        let total: usize = count
            .iter()
            .enumerate()
            .map(|(k, n)| n * (block << k))
            .sum();
        // Largest pieces first: each piece is aligned to its size (to a
        // page at least, from 4 KiB), as the allocation is.
        let mut rest = bdev.alloc_buf(total)?;
        let mut free: Vec<Vec<IoBuf>> = count.iter().map(|&n| Vec::with_capacity(n)).collect();
        for k in (0..=top).rev() {
            for _ in 0..count[k] {
                let (p, r) = rest.split_at(block << k);
                free[k].push(p);
                rest = r;
            }
        }
        let slots = (0..depth)
            .map(|_| Slot {
                tag: 0,
                write: false,
                flags: RwFlags::NONE,
                slba: 0,
                nlb: 0,
                segs: HostSegs::EMPTY,
                parts: 0,
                err: None,
            })
            .collect();
        Ok(Staging {
            shift,
            free,
            count,
            slots,
            free_slots: (0..depth as u32).rev().collect(),
            waiting: VecDeque::with_capacity(depth),
            in_flight: 0,
            waits: 0,
        })
    }

    /// Bytes of DMA memory in the pool.
    #[cfg(test)]
    pub fn pool_bytes(&self) -> usize {
        self.count
            .iter()
            .enumerate()
            .map(|(k, n)| n * (1usize << (self.shift as usize + k)))
            .sum()
    }

    fn top(&self) -> usize {
        self.free.len() - 1
    }

    /// A command of `nlb` blocks with `nsegs` host segments can be
    /// staged: the whole pool covers it in [`MAX_PARTS`] pieces.
    #[inline]
    pub fn fits(&self, nlb: u64, nsegs: usize) -> bool {
        let top = self.top();
        let big = nlb >> top;
        let small = (nlb & ((1 << top) - 1)).count_ones() as u64;
        nsegs <= HOST_SEGS && big <= self.count[top] as u64 && big + small <= MAX_PARTS as u64
    }

    /// Commands waiting for pieces.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Commands that had to wait for pieces since the pool was made.
    pub fn waits(&self) -> u64 {
        self.waits
    }

    /// Stages a command that [`fits`](Staging::fits): `nlb` blocks at
    /// `slba` with `flags`, its data in `segs`.
    ///
    /// # Safety
    /// The segments are valid memory for their lengths (writable for a
    /// read), total `nlb` blocks, and are touched by nothing else until
    /// the command's status has been handed out by [`complete`] or
    /// [`resume`] (or this is dropped).
    ///
    /// [`complete`]: Staging::complete
    /// [`resume`]: Staging::resume
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn submit(
        &mut self,
        io: &mut Io<'_>,
        tag: u32,
        write: bool,
        slba: u64,
        nlb: u64,
        flags: RwFlags,
        segs: &[Seg],
    ) -> Staged {
        if segs.len() > HOST_SEGS {
            // `fits` said no: the caller runs it synchronously.
            return Staged::Failed(SubmitError::TooManySegments {
                n: segs.len(),
                max: HOST_SEGS,
            });
        }
        let Some(s) = self.free_slots.pop() else {
            // `IoQueue` keeps at most `depth` commands outstanding.
            return Staged::Failed(SubmitError::QueueFull {
                depth: self.slots.len() as u32,
            });
        };
        let slot = &mut self.slots[s as usize];
        slot.tag = tag;
        slot.write = write;
        slot.flags = flags;
        slot.slba = slba;
        slot.nlb = nlb;
        slot.segs.n = segs.len();
        slot.segs.s[..segs.len()].copy_from_slice(segs);
        slot.parts = 0;
        slot.err = None;
        if !self.waiting.is_empty() {
            self.waits += 1;
            self.waiting.push_back(s);
            return Staged::Queued;
        }
        // SAFETY: forwarded contract.
        match unsafe { self.start(io, s) } {
            Start::Sent => Staged::Queued,
            Start::NoRoom => {
                self.waits += 1;
                self.waiting.push_back(s);
                Staged::Queued
            }
            Start::Failed(e) => {
                self.free_slots.push(s);
                Staged::Failed(e)
            }
        }
    }

    /// Takes pieces for command `s` and sends them, or takes nothing.
    ///
    /// # Safety
    /// As `submit`, for the segments recorded in slot `s`.
    unsafe fn start(&mut self, io: &mut Io<'_>, s: u32) -> Start {
        let shift = self.shift;
        let top = self.top();
        let slot = &self.slots[s as usize];
        let (write, flags, slba, nlb) = (slot.write, slot.flags, slot.slba, slot.nlb);
        let mut parts: [Option<IoBuf>; MAX_PARTS] = [const { None }; MAX_PARTS];
        let mut np = 0;
        let mut left = nlb;
        while left > 0 {
            let mut k = (left.ilog2() as usize).min(top);
            let piece = loop {
                if let Some(p) = self.free[k].pop() {
                    break Some(p);
                }
                if k == 0 {
                    break None;
                }
                k -= 1;
            };
            match piece {
                Some(p) if np < MAX_PARTS => {
                    parts[np] = Some(p);
                    np += 1;
                    left -= 1 << k;
                }
                other => {
                    if let Some(p) = other {
                        self.put(p);
                    }
                    for p in parts.iter_mut().filter_map(Option::take) {
                        self.put(p);
                    }
                    return Start::NoRoom;
                }
            }
        }
        let segs = self.slots[s as usize].segs;
        let mut cur = Cursor::new(segs.segs());
        let mut off = 0u64;
        let mut sent = 0u32;
        let mut refused = None;
        for p in parts.iter_mut().take(np) {
            let Some(mut b) = p.take() else { break };
            if refused.is_some() {
                self.put(b);
                continue;
            }
            let n = (b.len() >> shift) as u64;
            if write {
                // SAFETY: the recorded segments total `nlb` blocks of
                // valid memory (the caller's contract); the piece is ours.
                unsafe { cur.gather(b.as_mut_slice()) };
            }
            let u = UserData::new(s, Kind::Part, off).raw();
            let r = if write {
                io.write_with(slba + off, b, flags, u)
            } else {
                io.read_with(slba + off, b, flags, u)
            };
            match r {
                Ok(()) => sent += 1,
                Err(r) => {
                    if let Data::One(b) = r.data {
                        self.put(b);
                    }
                    refused = Some(r.error);
                }
            }
            off += n;
        }
        self.in_flight += sent;
        let slot = &mut self.slots[s as usize];
        slot.parts = sent;
        match refused {
            None => Start::Sent,
            Some(e) if sent == 0 => Start::Failed(e),
            Some(e) => {
                // Some pieces went out: the command fails once they are
                // back.
                tracing::error!(tag = slot.tag, slba, nlb, error = %e, "staged request partly refused");
                slot.err = Some(IoError::Failed);
                Start::Sent
            }
        }
    }

    /// Puts a piece back in its class.
    fn put(&mut self, b: IoBuf) {
        let k = ((b.len() >> self.shift).max(1).ilog2() as usize).min(self.top());
        self.free[k].push(b);
    }

    /// A piece's completion (`UserData::is_part`): scatters a read's
    /// data into the host segments, takes the piece back; the command's
    /// result once its last piece is back.
    ///
    /// # Safety
    /// The contract `submit` was called under holds for the command.
    pub unsafe fn complete(&mut self, c: Completion) -> Option<Finished> {
        let u = UserData::from_raw(c.user_data);
        let s = u.tag();
        let off = u.blocks() << self.shift;
        self.in_flight = self.in_flight.saturating_sub(1);
        let piece = match c.data {
            Data::One(b) => Some(b),
            other => {
                debug_assert!(false, "a staged piece came back as {other:?}");
                None
            }
        };
        let Some(slot) = self.slots.get_mut(s as usize) else {
            debug_assert!(false, "a staged piece of no command: {:#x}", c.user_data);
            if let Some(b) = piece {
                self.put(b);
            }
            return None;
        };
        match (&c.result, &piece) {
            (Ok(_), Some(b)) if !slot.write => {
                let mut cur = Cursor::new(slot.segs.segs());
                // SAFETY: the command's segments are valid and ours until
                // it is delivered (the caller's contract); `off` plus the
                // piece lies within them (the pieces cut its transfer);
                // the piece is back from the device.
                unsafe {
                    cur.skip(off as usize);
                    cur.scatter(b.as_slice());
                }
            }
            (Ok(_), _) => {}
            (Err(e), _) => {
                if slot.err.is_none() {
                    slot.err = Some(*e);
                }
            }
        }
        slot.parts = slot.parts.saturating_sub(1);
        let done = slot.parts == 0;
        if let Some(b) = piece {
            self.put(b);
        }
        if !done {
            return None;
        }
        Some(self.finish(s))
    }

    /// Command `s` is done: its record is free again.
    fn finish(&mut self, s: u32) -> Finished {
        let slot = &self.slots[s as usize];
        let kind = if slot.write { Kind::Write } else { Kind::Read };
        let u = UserData::new(slot.tag, kind, slot.nlb);
        let r = match slot.err {
            None => Ok(0),
            Some(e) => Err(e),
        };
        self.free_slots.push(s);
        (u, r)
    }

    /// Starts waiting commands while pieces suffice (a head that does
    /// not fit while nothing is in flight never will: it fails). Commands
    /// that fail here go to `done` with their error.
    ///
    /// # Safety
    /// As `complete`.
    pub unsafe fn resume(&mut self, io: &mut Io<'_>, done: &mut impl FnMut(Finished)) {
        while let Some(&s) = self.waiting.front() {
            // SAFETY: forwarded contract.
            match unsafe { self.start(io, s) } {
                Start::Sent => {}
                Start::NoRoom if self.in_flight > 0 => return,
                Start::NoRoom => {
                    tracing::error!("DMA staging pieces lost: failing a waiting command");
                    self.slots[s as usize].err = Some(IoError::Failed);
                    done(self.finish(s));
                }
                Start::Failed(e) => {
                    tracing::error!(error = %e, "bdev refused a staged request");
                    self.slots[s as usize].err = Some(IoError::Failed);
                    done(self.finish(s));
                }
            }
            self.waiting.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(block: u32, depth: u32, max_xfer: usize) -> Staging {
        let b: Bdev = Bdev::ram("r", block, 1 << 16).unwrap();
        Staging::new(&b, depth, max_xfer).unwrap()
    }

    #[test]
    fn pool_is_bounded_and_covers_the_largest_command() {
        // 512 B blocks, QD 128, 128 KiB transfers: 128 pieces of each
        // class up to 4 KiB, then 512 KiB per class: 3.5 MiB.
        let p = pool(512, 128, 128 << 10);
        assert_eq!(p.count, [128, 128, 128, 128, 64, 32, 16, 8, 4]);
        assert_eq!(p.pool_bytes(), (64 + 128 + 256 + 6 * 512) << 10);
        assert!(p.fits(256, 1) && p.fits(255, 4) && !p.fits(8, HOST_SEGS + 1));
        // 1 MiB transfers: the top class holds one whole command.
        let p = pool(4096, 32, 1 << 20);
        assert_eq!(p.count, [32, 32, 32, 16, 8, 8]);
        assert!(p.fits(256, 1) && !p.fits(9 * 32, 1));
        // Odd sizes need more pieces: 31 blocks are five.
        assert!(p.fits(31 + 7 * 32, 1));
        // A shallow queue gets a small pool; tiny transfers small pieces.
        let p = pool(4096, 2, 8192);
        assert_eq!(p.count, [2, 2]);
        assert_eq!(p.pool_bytes(), 24576);
        // Every piece is where it belongs.
        for (k, f) in p.free.iter().enumerate() {
            assert!(f.iter().all(|b| b.len() == 4096 << k));
        }
    }

    #[test]
    fn a_refused_command_keeps_no_record() {
        let b: Bdev = Bdev::ram("r", 512, 1 << 16).unwrap();
        let mut p = Staging::new(&b, 2, 128 << 10).unwrap();
        let mut ch = b.open(true).channel(&Default::default()).unwrap();
        let mut buf = vec![0u8; 512 * 5];
        let segs: Vec<Seg> = buf
            .chunks_mut(512)
            .map(|c| Seg {
                ptr: c.as_mut_ptr(),
                len: c.len(),
            })
            .collect();
        assert!(!p.fits(5, segs.len()));
        for _ in 0..3 {
            // SAFETY: `buf` outlives the call; nothing is started.
            let r = unsafe { p.submit(&mut ch.io(), 1, false, 0, 5, RwFlags::NONE, &segs) };
            assert!(matches!(
                r,
                Staged::Failed(SubmitError::TooManySegments { n: 5, max: 4 })
            ));
        }
        assert_eq!(p.free_slots.len(), 2);
        assert_eq!(ch.outstanding(), 0);
    }
}
