//! The two halves of a queue pair over TCP.
//!
//! # How the halves share one connection
//!
//! The core owns a queue pair's `SubmissionQueue` and `CompletionQueue`
//! separately (a completion handler submits through the SQ while the CQ
//! is being reaped), but over TCP both act on one connection. Rather than
//! share mutable state between the halves, the connection belongs to the
//! CQ half alone, and the SQ half is the producer end of a wait-free SPSC
//! ring (`rtrb`: loads and stores, no read-modify-writes, no locks) of
//! commands with their data address. The CQ sends what the ring holds at
//! the start of every `reap` (and in `ack_interrupt`, before an event loop
//! sleeps), then receives. Each half is `Send` on its own with no
//! `unsafe`: nothing breaks if they ever lived on different threads.
//!
//! So `publish`/`flush` send nothing by themselves: commands pushed in one
//! poll leave at the start of the next (`poll` → `reap`), which a polling
//! loop runs at once. The admin queue is the exception: its halves both
//! act on the shared admin link under its mutex, and push sends at once.
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pollux_nvme::error::{Result, SubmitError};
use pollux_nvme::{CompletionQueue, CqeSink, SubmissionQueue, WireCounters};
use pollux_spec::Sqe;

use crate::conn::{Conn, Data};
use crate::fabric::TcpFabric;
use crate::mem;
use pollux_nvme::fabrics::{self, AdminLink, ADMIN_MAX_DATA, ADMIN_SQ_ENTRIES};

/// A command on its way from the SQ half to the CQ half.
pub(crate) struct Cmd {
    sqe: Sqe,
    addr: u64,
    len: u32,
    cid: u16,
    /// Dataset Management range, carried in the capsule.
    range: Option<[u8; 16]>,
}

/// The submission half.
pub struct TcpSq(SqKind);

enum SqKind {
    Io(IoSq),
    Admin(Arc<AdminLink<TcpFabric>>),
}

struct IoSq {
    ring: rtrb::Producer<Cmd>,
    sends: Arc<AtomicU64>,
    sends_base: u64,
    max_data: usize,
}

/// The completion half.
pub struct TcpCq(CqKind);

enum CqKind {
    Io(Box<IoCq>),
    Admin(Arc<AdminLink<TcpFabric>>),
}

pub(crate) struct IoCq {
    pub conn: Option<Conn>,
    ring: rtrb::Consumer<Cmd>,
    sends: Arc<AtomicU64>,
    /// The association's `lost` flag (see `link`).
    lost: Arc<AtomicBool>,
    entries: u16,
    depth: u16,
    sq_entries: u16,
    pub interrupts: bool,
    /// Sends of connections closed since (the counters survive a reconnect).
    sends_before: u64,
    recv_base: u64,
    /// Commands taken from the ring that the connection refused (it had
    /// died): sent on the next one (`attach`).
    held: Vec<Cmd>,
    /// The Dataset Management range of each CID's last deallocate (the
    /// connection copied it into the capsule; kept to send it again).
    ranges: Vec<[u8; 16]>,
    /// Commands sent again `fabrics::MAX_RETRIES` times already when yet
    /// another reset came: they complete with Command Aborted By Host
    /// instead (`fabrics::retry`).
    aborted: Vec<u16>,
}

/// A new I/O queue pair's halves around `conn`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn io_pair(
    conn: Conn,
    depth: u16,
    sq_entries: u16,
    entries: u16,
    max_data: usize,
    lost: Arc<AtomicBool>,
    interrupts: bool,
) -> (TcpSq, TcpCq) {
    // The core never has more than `depth` commands outstanding, so never
    // more than that many pushed and not yet sent.
    let (tx, rx) = rtrb::RingBuffer::new(depth as usize + 1);
    let sends = Arc::new(AtomicU64::new(0));
    (
        TcpSq(SqKind::Io(IoSq {
            ring: tx,
            sends: sends.clone(),
            sends_base: 0,
            max_data,
        })),
        TcpCq(CqKind::Io(Box::new(IoCq {
            conn: Some(conn),
            ring: rx,
            sends,
            lost,
            entries,
            depth,
            sq_entries,
            interrupts,
            sends_before: 0,
            recv_base: 0,
            held: Vec::new(),
            ranges: vec![[0; 16]; depth as usize],
            aborted: Vec::new(),
        }))),
    )
}

pub(crate) fn admin_pair(link: Arc<AdminLink<TcpFabric>>) -> (TcpSq, TcpCq) {
    (
        TcpSq(SqKind::Admin(link.clone())),
        TcpCq(CqKind::Admin(link)),
    )
}

impl TcpCq {
    pub(crate) fn io(&mut self) -> Option<&mut IoCq> {
        match &mut self.0 {
            CqKind::Io(c) => Some(c),
            CqKind::Admin(_) => None,
        }
    }
}

impl SubmissionQueue for TcpSq {
    #[inline]
    unsafe fn push(
        &mut self,
        cid: u16,
        sqe: Sqe,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError> {
        if len > 0 {
            // Only this transport's buffers, and only contiguous ones (ours
            // always are): anything else is not memory we may touch.
            if !mem::is_ours(addr0) || addr_at(len - 1) != addr0 + (len as u64 - 1) {
                return Err(SubmitError::BadBuffer);
            }
        }
        match &mut self.0 {
            SqKind::Io(q) => {
                if len > q.max_data {
                    return Err(SubmitError::BufferLength {
                        expected: q.max_data,
                        got: len,
                    });
                }
                q.ring
                    .push(Cmd {
                        sqe,
                        addr: addr0,
                        len: len as u32,
                        cid,
                        range: None,
                    })
                    .map_err(|_| SubmitError::QueueFull {
                        limit: q.ring.buffer().capacity(),
                    })
            }
            SqKind::Admin(link) => link.push(cid, sqe, addr0, len),
        }
    }

    unsafe fn push_dealloc(&mut self, cid: u16, nsid: u32, lba: u64, nlb: u32) {
        let mut range = [0u8; 16];
        range[4..8].copy_from_slice(&nlb.to_le_bytes());
        range[8..16].copy_from_slice(&lba.to_le_bytes());
        // Dataset Management, one range (NR 0's based), Attribute Deallocate.
        let sqe = Sqe::dsm(nsid, 0, 1 << 2, 0);
        match &mut self.0 {
            SqKind::Io(q) => {
                if q.ring
                    .push(Cmd {
                        sqe,
                        addr: 0,
                        len: 16,
                        cid,
                        range: Some(range),
                    })
                    .is_err()
                {
                    tracing::error!(cid, "deallocate dropped: command ring full");
                }
            }
            SqKind::Admin(_) => tracing::error!("deallocate on the admin queue ignored"),
        }
    }

    #[inline(always)]
    fn publish(&mut self, _outstanding: u32) {}

    #[inline(always)]
    fn flush(&mut self) {}

    unsafe fn restart(&mut self) {}

    fn max_data(&self) -> usize {
        match &self.0 {
            SqKind::Io(q) => q.max_data,
            SqKind::Admin(_) => ADMIN_MAX_DATA,
        }
    }

    fn counters(&self) -> WireCounters {
        match &self.0 {
            SqKind::Io(q) => WireCounters {
                doorbells: q.sends.load(Ordering::Relaxed).saturating_sub(q.sends_base),
                shadow_updates: 0,
            },
            SqKind::Admin(_) => WireCounters::default(),
        }
    }

    fn reset_counters(&mut self) {
        if let SqKind::Io(q) = &mut self.0 {
            q.sends_base = q.sends.load(Ordering::Relaxed);
        }
    }
}

impl IoCq {
    /// Sends what the SQ half pushed.
    #[inline]
    fn send_pushed(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if self.ring.is_empty() && !conn.tx_pending() {
            return;
        }
        while let Ok(c) = self.ring.pop() {
            if let Some(r) = &c.range {
                if let Some(k) = self.ranges.get_mut(c.cid as usize) {
                    *k = *r;
                }
            }
            // SAFETY: the command came through `TcpSq::push`, whose caller
            // keeps its buffer (checked to be this transport's) allocated
            // and untouched until its completion is reaped from this CQ
            // or the queue is restarted (which drops this connection).
            let r = unsafe { conn.submit(c.cid, c.sqe, c.data(), c.cid, false) };
            if r.is_err() {
                // The connection is dead (`broken` makes the core reset):
                // this command goes on the next one, and what remains in
                // the ring after it.
                self.held.push(c);
                break;
            }
        }
        let _ = conn.flush_tx();
        self.sends
            .store(self.sends_before + conn.sends, Ordering::Relaxed);
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth as usize
    }

    pub(crate) fn sq_entries(&self) -> u16 {
        self.sq_entries
    }

    /// The queue was re-created on a new connection. The commands
    /// outstanding on the old one (the core keeps them and their buffers
    /// across the reset: `reconnects`) go again, with those the old one
    /// refused; what they had transferred is done again from the start.
    pub(crate) fn attach(&mut self, mut conn: Conn) {
        let mut again = Vec::new();
        let mut tries = vec![0u8; self.depth as usize];
        if let Some(old) = self.conn.take() {
            self.sends_before += old.sends;
            for s in old.slots().iter().filter(|s| s.active && !s.internal) {
                let Some(again_tries) = fabrics::retry(s.tries) else {
                    tracing::error!(
                        addr = %old.addr,
                        qid = old.qid,
                        cid = s.tag,
                        "command outstanding at {} resets in a row: aborted",
                        fabrics::MAX_RETRIES + 1
                    );
                    self.aborted.push(s.tag);
                    continue;
                };
                if let Some(t) = tries.get_mut(s.tag as usize) {
                    *t = again_tries;
                }
                let (sqe, addr, len) = s.resend();
                let range = (addr == 0 && len > 0)
                    .then(|| self.ranges.get(s.tag as usize).copied())
                    .flatten();
                again.push(Cmd {
                    sqe,
                    addr,
                    len,
                    cid: s.tag,
                    range,
                });
            }
        }
        again.append(&mut self.held);
        if !again.is_empty() {
            tracing::info!(
                addr = %conn.addr,
                qid = conn.qid,
                commands = again.len(),
                "sending the commands outstanding at the reset again"
            );
        }
        for c in again {
            // SAFETY: commands outstanding at the reset, or pushed and not
            // sent: the core keeps their buffers across the reset (the
            // transport `reconnects`) until their completions are reaped.
            let r = unsafe { conn.submit(c.cid, c.sqe, c.data(), c.cid, false) };
            if r.is_err() {
                self.held.push(c);
            } else if let Some(s) = conn.slots_mut().get_mut(c.cid as usize) {
                s.tries = tries.get(c.cid as usize).copied().unwrap_or(0);
            }
        }
        self.conn = Some(conn);
    }

    /// Completes the commands `attach` gave up on.
    #[cold]
    fn deliver_aborted<S: CqeSink>(&mut self, max: u32, sink: &mut S) -> u32 {
        let st = fabrics::aborted_status();
        let n = (max as usize).min(self.aborted.len());
        for cid in self.aborted.drain(..n) {
            sink.cqe(cid, st, 0);
        }
        n as u32
    }
}

impl Cmd {
    /// Its data as the connection takes it.
    #[inline(always)]
    fn data(&self) -> Data<'_> {
        if let Some(r) = &self.range {
            Data::Bytes(r)
        } else if self.len == 0 {
            Data::None
        } else if self.sqe.opc & 3 == 1 {
            Data::Out {
                addr: self.addr,
                len: self.len,
            }
        } else {
            Data::In {
                addr: self.addr,
                len: self.len,
            }
        }
    }
}

impl CompletionQueue for TcpCq {
    #[inline]
    fn reap<S: CqeSink>(&mut self, max: u32, sink: &mut S) -> u32 {
        match &mut self.0 {
            CqKind::Io(q) => {
                if !q.aborted.is_empty() {
                    return q.deliver_aborted(max, sink);
                }
                q.send_pushed();
                let Some(conn) = q.conn.as_mut() else {
                    return 0;
                };
                if conn.dead.is_some() {
                    return 0;
                }
                // An error stays in the connection (`broken`); the
                // completions before it count.
                conn.poll(max, &mut |_, s, cqe| {
                    sink.cqe(s.tag, cqe.status >> 1, cqe.dw0)
                })
                .0
            }
            CqKind::Admin(link) => link.reap(max, &mut |t, s, d| sink.cqe(t, s, d)),
        }
    }

    #[inline(always)]
    fn release(&mut self, _n: u32) {}

    unsafe fn restart(&mut self) {
        match &mut self.0 {
            CqKind::Io(q) => {
                // Forget every command: the connection closes, nothing
                // points at their buffers any more.
                if let Some(old) = q.conn.take() {
                    q.sends_before += old.sends;
                }
                while q.ring.pop().is_ok() {}
                q.held.clear();
                q.aborted.clear();
            }
            CqKind::Admin(link) => link.restart(),
        }
    }

    fn entries(&self) -> u16 {
        match &self.0 {
            CqKind::Io(q) => q.entries,
            CqKind::Admin(_) => ADMIN_SQ_ENTRIES,
        }
    }

    fn counters(&self) -> WireCounters {
        WireCounters::default()
    }

    fn reset_counters(&mut self) {
        if let CqKind::Io(q) = &mut self.0 {
            q.recv_base = 0;
        }
    }

    fn ready(&self) -> bool {
        match &self.0 {
            CqKind::Io(q) => q.conn.as_ref().is_some_and(|c| {
                c.dead.is_none()
                    && (c.has_rx()
                        || pollux_nvme::wait_readable(&[c.fd()], Some(std::time::Duration::ZERO))
                            .unwrap_or(false))
            }),
            CqKind::Admin(link) => link.ready(),
        }
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.0 {
            CqKind::Io(q) if q.interrupts => q.conn.as_ref().map(|c| c.fd()),
            _ => None,
        }
    }

    fn ack_interrupt(&mut self) -> Result<()> {
        if let CqKind::Io(q) = &mut self.0 {
            q.send_pushed();
        }
        Ok(())
    }

    #[inline]
    fn broken(&self) -> bool {
        match &self.0 {
            CqKind::Io(q) => match &q.conn {
                Some(c) => c.dead.is_some() || q.lost.load(Ordering::Relaxed),
                None => false,
            },
            CqKind::Admin(_) => false,
        }
    }
}
