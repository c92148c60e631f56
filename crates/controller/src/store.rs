//! A namespace's storage as one I/O queue sees it: its own channel to the
//! namespace's bdev ([`NsChan`]).
//!
//! Reads and writes lend the command's data segments to the bdev
//! (`readv_raw`/`writev_raw`: no copy; `IoQueue::start`). The bdev takes
//! only segments of whole blocks (and aligned to its buffer alignment):
//! [`NsChan::misaligned`] tells. A command whose data starts at an offset
//! that is not a multiple of the LBA size has such segments, and only
//! such a command goes through a block-aligned bounce buffer, [`BOUNCE`]
//! bytes at a time, synchronously ([`NsChan::rw_bounce`]: the channel is
//! polled until each request is back; completions of other requests met
//! meanwhile are stashed for `IoQueue::poll`).
//!
//! An NVMe bdev (`Bdev` with a real transport `T`) takes no lent host
//! memory, only its controller's DMA buffers (`IoBuf`s): its segments
//! always count as misaligned (the I/O path of the other backends is
//! unchanged). Asynchronously (a queue with a depth), its reads and writes
//! are staged through a pool of DMA pieces the channel owns, many commands
//! at once (`stage`). Synchronously (and for the few commands the pool
//! does not take: more than `stage::HOST_SEGS` segments, or larger than
//! the pool covers), they go through DMA bounce pieces of their own, one
//! request at a time: `block << k` bytes for every `k` up to [`BOUNCE`],
//! cut once from one allocation; a transfer is moved in the largest
//! pieces that fit (a power-of-two number of blocks per request).
use std::collections::VecDeque;

use pollux_bdev::{
    Bdev, Channel, ChannelOptions, Completion, Data, Io, IoBuf, IoError, RawSeg as Seg, SubmitError,
};
use pollux_spec::cmd::RwFlags;

use crate::cursor::Cursor;
use crate::stage::{Finished, Staging};
use crate::user_data::UserData;

/// Bytes of the bounce buffer of a namespace channel (a multiple of every
/// LBA size offered).
pub(crate) const BOUNCE: usize = 64 << 10;

/// Bytes of a RAM namespace an asynchronous queue zeroes or deallocates
/// per bdev request (a RAM bdev does it within the call: handing back
/// 16 MiB of written pages took 0.7 ms here, 1 GiB 48 ms).
pub(crate) const RAM_ZERO_PIECE: u64 = 16 << 20;
/// Blocks of an NVMe namespace per such request: 16 commands of the bdev
/// layer's 65536 blocks (it submits a request's commands at once).
pub(crate) const NVME_ZERO_PIECE: u64 = 16 << 16;

// An I/O queue may be built on one thread and moved to the one that runs
// it; it must not hide a channel that is not `Send`.
const _: () = {
    const fn send<T: Send>() {}
    send::<Channel>();
};

/// Why a namespace operation failed (logged, then turned into an NVMe
/// status by the caller).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("bdev refused the request: {0}")]
    Refused(#[from] SubmitError),
    #[error("bdev request failed: {0}")]
    Failed(#[from] IoError),
    #[error("{0}")]
    Bounce(&'static str),
}

/// Where commands with segments the bdev cannot take are staged.
enum Bounce {
    /// [`BOUNCE`] bytes lent to the bdev (host-memory backends).
    Host(IoBuf),
    /// An NVMe bdev's DMA pieces: `pieces[k]` is `block << k` bytes (the
    /// `Option` is empty while the piece is in a request).
    Pieces(Vec<Option<IoBuf>>),
}

/// One queue's channel to a namespace's bdev.
pub(crate) struct NsChan {
    pub ch: Channel,
    pub shift: u32,
    /// Size in blocks.
    pub nsze: u64,
    /// A segment is usable in place iff `len & len_mask` and
    /// `ptr & addr_mask` are zero (whole blocks, the bdev's alignment).
    /// An NVMe bdev's `addr_mask` is all ones: no segment is usable.
    len_mask: usize,
    addr_mask: usize,
    /// For commands whose segments are not (see the module doc).
    bounce: Bounce,
    /// Completions of asynchronous requests met while waiting for a
    /// synchronous one (delivered by the next `IoQueue::poll`).
    pub stash: VecDeque<Finished>,
    /// An NVMe bdev's asynchronous reads and writes (a queue with a
    /// depth).
    pub staging: Option<Staging>,
    /// Most blocks one asynchronous write zeroes or deallocate request
    /// covers (larger ones go piece by piece, `io::multi`): bounds what
    /// one request costs the queue's thread (RAM: pages handed back within
    /// the call) and how many commands it makes at once (NVMe). Unbounded
    /// where the backend's work is asynchronous already (io_uring) or
    /// nothing (null).
    pub zero_piece: u64,
}

impl NsChan {
    /// Requests in flight or completions not yet delivered (a removed
    /// namespace's channel is kept while so).
    pub fn busy(&self) -> bool {
        self.ch.outstanding() > 0
            || !self.stash.is_empty()
            || self.staging.as_ref().is_some_and(|s| s.waiting() > 0)
    }

    /// `depth`: asynchronous requests at most (0: synchronous use only);
    /// `max_xfer`: the largest transfer of a command.
    pub fn new(
        bdev: &Bdev,
        nsze: u64,
        depth: u32,
        max_xfer: usize,
    ) -> Result<NsChan, pollux_bdev::Error> {
        let info = bdev.info();
        let dma_only = !info.caps.host_memory;
        let (shift, len_mask, addr_mask) = (
            info.block_shift(),
            info.block_size as usize - 1,
            if dma_only {
                usize::MAX
            } else {
                info.buf_align.max(1) as usize - 1
            },
        );
        let bounce = if dma_only {
            Bounce::Pieces(dma_pieces(bdev)?)
        } else {
            Bounce::Host(bdev.alloc_buf(BOUNCE)?)
        };
        let staging = if dma_only && depth > 0 {
            Some(Staging::new(bdev, depth, max_xfer)?)
        } else {
            None
        };
        // The asynchronous requests plus one synchronous one, which is
        // polled to completion.
        let ch = bdev.open(true).channel(&ChannelOptions {
            depth: depth + 1,
            latency: false,
            nvme: None,
        })?;
        let zero_piece = match info.backend {
            "ram" => (RAM_ZERO_PIECE >> shift).max(1),
            "nvme" => NVME_ZERO_PIECE,
            _ => u64::MAX,
        };
        Ok(NsChan {
            ch,
            shift,
            nsze,
            len_mask,
            addr_mask,
            bounce,
            stash: VecDeque::with_capacity(depth as usize),
            staging,
            zero_piece,
        })
    }

    /// Polls until the synchronous request completes (completions of
    /// asynchronous ones go to the stash).
    #[inline(always)]
    fn wait(&mut self) -> Result<(), IoError> {
        let mut res = None;
        let NsChan {
            ch, stash, staging, ..
        } = self;
        loop {
            ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
                if c.user_data == UserData::SYNC.raw() {
                    res = Some(c.result);
                } else {
                    stash_async(stash, staging, c);
                }
            });
            if let Some(r) = res {
                return r.map(drop);
            }
            std::hint::spin_loop();
        }
    }

    /// The segments cannot be lent to the bdev as they are.
    #[inline(always)]
    pub fn misaligned(&self, segs: &[Seg]) -> bool {
        // One segment (a transfer within a page) is whole blocks already.
        let odd = match segs {
            [s] => s.ptr as usize & self.addr_mask,
            _ => segs.iter().fold(0, |a, s| {
                a | (s.len & self.len_mask) | (s.ptr as usize & self.addr_mask)
            }),
        };
        odd != 0
    }

    /// Reads (`write` false) or writes whole blocks at `lba` from or to
    /// the segments, which total a whole number of blocks, synchronously,
    /// with `flags` (a FUA write returns once durable), through the bounce
    /// buffer, `BOUNCE` bytes per request (an NVMe bdev: through its DMA
    /// pieces, `rw_pieces`): for segments the bdev cannot take
    /// (`misaligned`).
    ///
    /// # Safety
    /// The segments are valid memory (writable for reads), untouched by
    /// anything else until this returns.
    #[cold]
    #[inline(never)]
    pub unsafe fn rw_bounce(
        &mut self,
        write: bool,
        lba: u64,
        segs: &[Seg],
        flags: RwFlags,
    ) -> Result<(), StoreError> {
        let total: usize = segs.iter().map(|s| s.len).sum();
        let mut cur = Cursor::new(segs);
        if matches!(self.bounce, Bounce::Pieces(_)) {
            // SAFETY: forwarded contract.
            return unsafe { self.rw_pieces(write, lba, total, cur, flags) };
        }
        let mut done = 0;
        while done < total {
            let n = (total - done).min(BOUNCE);
            let at = lba + (done >> self.shift) as u64;
            let Bounce::Host(bounce) = &mut self.bounce else {
                return Err(StoreError::Bounce("bounce buffer changed kind"));
            };
            let buf = &mut bounce.as_mut_slice()[..n];
            if write {
                // SAFETY: forwarded contract.
                unsafe { cur.gather(buf) };
            }
            let seg = [Seg {
                ptr: buf.as_mut_ptr(),
                len: n,
            }];
            let mut io = self.ch.io();
            // SAFETY: the bounce buffer is ours, `n` bytes long, and only
            // the bdev touches it until `wait` returns (`buf` is not used
            // again: it is re-borrowed below).
            unsafe {
                if write {
                    io.writev_raw_with(at, &seg, flags, UserData::SYNC.raw())?
                } else {
                    io.readv_raw_with(at, &seg, flags, UserData::SYNC.raw())?
                }
            }
            self.wait()?;
            if !write {
                let Bounce::Host(b) = &self.bounce else {
                    return Err(StoreError::Bounce("bounce buffer changed kind"));
                };
                // SAFETY: forwarded contract.
                unsafe { cur.scatter(&b.as_slice()[..n]) };
            }
            done += n;
        }
        Ok(())
    }

    /// `rw_bounce` of `total` bytes (whole blocks) at `lba` through an NVMe
    /// bdev's DMA pieces: each command moves the largest piece that fits,
    /// synchronously.
    ///
    /// # Safety
    /// As `rw_bounce`; `cur` is at the start of the command's segments.
    #[cold]
    #[inline(never)]
    unsafe fn rw_pieces(
        &mut self,
        write: bool,
        lba: u64,
        total: usize,
        mut cur: Cursor<'_>,
        flags: RwFlags,
    ) -> Result<(), StoreError> {
        let mut done = 0;
        while done < total {
            let blocks = (total - done) >> self.shift;
            if blocks == 0 {
                return Err(StoreError::Bounce(
                    "transfer is not a whole number of blocks",
                ));
            }
            let Bounce::Pieces(pieces) = &mut self.bounce else {
                return Err(StoreError::Bounce("bounce buffer changed kind"));
            };
            let k = (blocks.ilog2() as usize).min(pieces.len() - 1);
            let Some(mut buf) = pieces[k].take() else {
                return Err(StoreError::Bounce("DMA bounce piece lost"));
            };
            let n = buf.len();
            let at = lba + (done >> self.shift) as u64;
            if write {
                // SAFETY: forwarded contract.
                unsafe { cur.gather(buf.as_mut_slice()) };
            }
            let mut io = self.ch.io();
            let r = if write {
                io.write_with(at, buf, flags, UserData::SYNC.raw())
            } else {
                io.read_with(at, buf, flags, UserData::SYNC.raw())
            };
            if let Err(refused) = r {
                self.put_piece(k, refused.data);
                return Err(StoreError::Refused(refused.error));
            }
            let (r, data) = self.wait_owned();
            self.put_piece(k, data);
            r?;
            if !write {
                let Bounce::Pieces(pieces) = &self.bounce else {
                    return Err(StoreError::Bounce("bounce buffer changed kind"));
                };
                let Some(buf) = &pieces[k] else {
                    return Err(StoreError::Bounce("DMA bounce piece lost"));
                };
                // SAFETY: forwarded contract.
                unsafe { cur.scatter(buf.as_slice()) };
            }
            done += n;
        }
        Ok(())
    }

    /// Puts DMA piece `k` back from a request's data.
    fn put_piece(&mut self, k: usize, data: Data) {
        if let (Bounce::Pieces(p), Data::One(b)) = (&mut self.bounce, data) {
            p[k] = Some(b);
        }
    }

    /// `wait` for a request of owned buffers: also hands them back.
    fn wait_owned(&mut self) -> (Result<(), IoError>, Data) {
        let mut res = None;
        let mut data = Data::None;
        let NsChan {
            ch, stash, staging, ..
        } = self;
        loop {
            ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
                if c.user_data == UserData::SYNC.raw() {
                    res = Some(c.result);
                    data = c.data;
                } else {
                    stash_async(stash, staging, c);
                }
            });
            if let Some(r) = res {
                return (r.map(drop), data);
            }
            std::hint::spin_loop();
        }
    }
}

/// The completion of an asynchronous request met by a synchronous wait:
/// stashed for the next `IoQueue::poll` (a staged piece is taken back
/// first, a read's data scattered, and its command's result stashed once
/// its last piece is in).
#[cold]
#[inline(never)]
fn stash_async(stash: &mut VecDeque<Finished>, staging: &mut Option<Staging>, c: Completion) {
    match staging {
        Some(st) if UserData::from_raw(c.user_data).is_part() => {
            // SAFETY: `IoQueue::submit`'s contract holds for staged
            // commands until they are delivered, which the stash's next
            // poll does.
            if let Some(done) = unsafe { st.complete(c) } {
                stash.push_back(done);
            }
        }
        _ => stash.push_back((UserData::from_raw(c.user_data), c.result)),
    }
}

/// An NVMe bdev's DMA bounce pieces (see the module doc): `block << k`
/// bytes for `k` in `0..=log2(BOUNCE / block)`, cut from one allocation.
fn dma_pieces(bdev: &Bdev) -> Result<Vec<Option<IoBuf>>, pollux_bdev::Error> {
    let block = bdev.info().block_size as usize;
    let top = (BOUNCE / block.max(1)).max(1).ilog2() as usize;
    let mut rest = bdev.alloc_buf((block << (top + 1)) - block)?;
    let mut pieces: Vec<Option<IoBuf>> = (0..=top).map(|_| None).collect();
    for k in (0..=top).rev() {
        let (p, r) = rest.split_at(block << k);
        pieces[k] = Some(p);
        rest = r;
    }
    Ok(pieces)
}
