//! The admin connection ("link") of an association: fabrics Connect on
//! QID 0, the controller's registers through Property Get/Set, the core's
//! admin commands, and Keep Alive. The control path: one mutex around it
//! all (the core's admin queue, `Registers` calls from any thread and the
//! keep-alive thread share the connection).
//!
//! # Associations, resets and lost connections
//!
//! A controller reset over fabrics is a new association (as Linux does it):
//! when the core clears CC.EN the link sends that Property Set and closes
//! the connection; until the core enables the controller again, CC and
//! CSTS read as 0 (disabled, not ready). `attach_admin` (before CC.EN=1)
//! connects again, with CNTLID 0xFFFF, getting a new controller; the core
//! then re-creates the I/O queues, each a new connection naming that
//! controller ID.
//!
//! A link lost without the host asking (closed, terminated, keep-alive
//! unanswered) makes CSTS read as fatal (CFS) and sets the association's
//! `lost` flag, which every I/O queue reports as `broken`: the core
//! resets (on a thread of its own), and the reset reconnects or fails the
//! controller for good. Reconnecting follows Linux's host: an attempt at
//! once, then one every `reconnect_delay`, until `ctrl_loss_tmo` has passed
//! (`ensure`, on the schedule of `reconnect`); `fast_io_fail_tmo` after the
//! start, `fail_fast` tells the queue pairs to fail the I/O they hold. Admin commands outstanding on a
//! lost link complete with Host Pathing Error.
//!
//! Nothing waits for a reconnect on the mutex: the attempts and the waits
//! between them run without it, and while the link is lost a register read
//! answers from the `lost` flag without taking it.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pollux_spec::fabrics::{PropertySize, CNTLID_DYNAMIC};
use pollux_spec::regs::{self, Cc};
use pollux_spec::{Cqe, Sqe};

use crate::error::{Error, Result, SubmitError};
use crate::fabrics::connect;
use crate::fabrics::held::path_error;
use crate::fabrics::options::FabricsOptions;
use crate::fabrics::property;
use crate::fabrics::reconnect::{Next, Schedule, Wait};
use crate::fabrics::wire::{CapsuleData, Connection, Fabric};

/// Command slots of the admin connection (the core's admin commands, and
/// the link's own: properties, keep-alive).
pub const ADMIN_SLOTS: usize = 128;
/// Admin SQ size asked for in Connect (Linux's NVME_AQ_DEPTH).
pub const ADMIN_SQ_ENTRIES: u16 = 32;
/// Most data bytes of one admin command.
pub const ADMIN_MAX_DATA: usize = 64 << 10;
const KEEP_ALIVE_OPCODE: u8 = 0x18;

/// A completion of one of the core's admin commands, received and not yet
/// handed to the core.
struct Done {
    tag: u16,
    status: u16,
    dw0: u32,
    /// The data a controller-to-host command received (its bounce buffer).
    data: Option<Vec<u8>>,
}

/// Whose command a wire CID of the link carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The link's own (properties, keep-alive).
    Link,
    /// The core's, with its tag (the core's CID).
    Core(u16),
}

struct LinkState<C> {
    conn: Option<C>,
    cntlid: u16,
    /// The host disabled the controller and closed the link: CC/CSTS read 0.
    torn_down: bool,
    /// The commands outstanding on the connection, by wire CID.
    owners: Vec<Option<Owner>>,
    /// Completions of the core's commands, received (by whoever polled the
    /// link: the core's `reap`, a register access, the keep-alive thread)
    /// and handed to the core by `reap`.
    stash: VecDeque<Done>,
    /// Completions of the link's own commands, by wire CID.
    internal: Vec<Option<Cqe>>,
    /// The buffer of the command the core pushed last: its tag, address
    /// and length. The core's admin queue waits only for that command, and
    /// only while it waits (inside `reap`) is the buffer lent to us; so
    /// data is copied only there, only for that command, and a push
    /// replaces it. A completion that comes after its wait ended (the
    /// command timed out and its buffer went back to the caller, or was
    /// freed) is delivered without its data.
    dest: Option<(u16, u64, u32)>,
    /// Keep Alive outstanding: wire CID and when it was sent.
    ka: Option<(u16, Instant)>,
}

impl<C: Connection> LinkState<C> {
    /// A wire CID with nothing outstanding.
    fn free_wcid(&self) -> Option<u16> {
        self.owners
            .iter()
            .position(|o| o.is_none())
            .map(|w| w as u16)
    }

    /// Sends a command on wire CID `w` for `owner` and flushes.
    fn send(&mut self, w: u16, owner: Owner, sqe: Sqe, data: CapsuleData<'_>) -> Result<()> {
        let Some(c) = self.conn.as_mut() else {
            return Ok(());
        };
        c.send(w, sqe, data)?;
        self.owners[w as usize] = Some(owner);
        c.flush()
    }
}

/// The admin link. See the module docs.
pub struct AdminLink<F: Fabric> {
    /// How connections to the controller are made.
    pub fabric: F,
    pub opts: FabricsOptions,
    st: Mutex<LinkState<F::Conn>>,
    /// The association was lost (set here, read by every I/O queue).
    pub lost: Arc<AtomicBool>,
    /// A reset is reconnecting (`ensure`).
    pub reconnecting: AtomicBool,
    /// A reconnect has run longer than `fast_io_fail_tmo`.
    pub fail_fast: AtomicBool,
    /// Reconnect attempts made.
    pub attempts: AtomicU64,
    /// CAP, read once at the first connection.
    pub cap: u64,
}

impl<F: Fabric> AdminLink<F> {
    /// Connects the admin queue (Connect with CNTLID 0xFFFF) and reads CAP.
    pub fn connect(fabric: F, opts: FabricsOptions) -> Result<AdminLink<F>> {
        pollux_spec::fabrics::validate_nqn(&opts.subnqn)
            .map_err(|e| Error::InvalidArgument(format!("subnqn '{}': {e}", opts.subnqn)))?;
        pollux_spec::fabrics::validate_nqn(&opts.hostnqn)
            .map_err(|e| Error::InvalidArgument(format!("hostnqn '{}': {e}", opts.hostnqn)))?;
        if opts.reconnect_delay.is_zero() {
            return Err(Error::InvalidArgument(
                "reconnect_delay must not be zero".into(),
            ));
        }
        let mut link = AdminLink {
            fabric,
            opts,
            st: Mutex::new(LinkState {
                conn: None,
                cntlid: 0,
                torn_down: false,
                owners: vec![None; ADMIN_SLOTS],
                stash: VecDeque::new(),
                internal: vec![None; ADMIN_SLOTS],
                dest: None,
                ka: None,
            }),
            lost: Arc::new(AtomicBool::new(false)),
            reconnecting: AtomicBool::new(false),
            fail_fast: AtomicBool::new(false),
            attempts: AtomicU64::new(0),
            cap: 0,
        };
        let (conn, cntlid) =
            link.connect_queue(0, ADMIN_SQ_ENTRIES, CNTLID_DYNAMIC, ADMIN_SLOTS)?;
        {
            let st = link.st.get_mut().unwrap_or_else(|p| p.into_inner());
            st.conn = Some(conn);
            st.cntlid = cntlid;
        }
        link.cap = link.property_get(regs::off::CAP, PropertySize::Eight)?;
        Ok(link)
    }

    /// Opens a connection for queue `qid` of this association and sends
    /// Connect (`cntlid`: 0xFFFF for the admin queue), returning it and
    /// the controller ID (see `connect`).
    pub fn connect_queue(
        &self,
        qid: u16,
        sq_entries: u16,
        cntlid: u16,
        slots: usize,
    ) -> Result<(F::Conn, u16)> {
        connect::connect_queue(&self.fabric, &self.opts, qid, sq_entries, cntlid, slots)
    }

    fn lock(&self) -> MutexGuard<'_, LinkState<F::Conn>> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn cntlid(&self) -> u16 {
        self.lock().cntlid
    }

    /// Connects a new association unless the link is alive: an attempt at
    /// once, then one every `reconnect_delay` while that is within
    /// `ctrl_loss_tmo` of the start (Linux's policy). Runs without the
    /// mutex (only a reset calls it, under the core's admin lock).
    pub fn ensure(&self) -> Result<()> {
        if Self::alive(&self.lock()) {
            return Ok(());
        }
        let addr = self.fabric.addr();
        let start = Instant::now();
        let mut sched = Schedule::new(&self.opts);
        self.reconnecting.store(true, Ordering::Release);
        let r = loop {
            let attempt = sched.attempt();
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let e = match self.connect_queue(0, ADMIN_SQ_ENTRIES, CNTLID_DYNAMIC, ADMIN_SLOTS) {
                Ok((conn, cntlid)) => {
                    let mut st = self.lock();
                    self.fail_outstanding(&mut st);
                    // A new connection: no wire CID is in use.
                    st.owners.fill(None);
                    st.conn = Some(conn);
                    st.cntlid = cntlid;
                    st.torn_down = false;
                    st.ka = None;
                    self.lost.store(false, Ordering::Release);
                    tracing::info!(addr = %addr, cntlid, attempt, "reconnected (new association)");
                    break Ok(());
                }
                Err(e) => e,
            };
            let next = match sched.next(start.elapsed()) {
                Next::At(next) => next,
                Next::GiveUp(tmo) => {
                    tracing::error!(
                        addr = %addr,
                        attempt,
                        "reconnecting failed: {e}; ctrl_loss_tmo ({} s) has passed: giving up",
                        tmo.as_secs_f64()
                    );
                    break Err(Error::Platform(format!(
                        "no new association with {} within ctrl_loss_tmo ({} s, {attempt} attempts): {e}",
                        addr,
                        tmo.as_secs_f64()
                    )));
                }
            };
            tracing::warn!(
                addr = %addr,
                attempt,
                "reconnecting: {e}; next attempt in {:.1} s",
                // (At once when the attempt took longer than the schedule:
                // `next` is then the time it failed, already past.)
                next.saturating_sub(start.elapsed()).as_secs_f64()
            );
            self.wait_until(&mut sched, start, next);
        };
        self.fail_fast.store(false, Ordering::Release);
        self.reconnecting.store(false, Ordering::Release);
        r
    }

    /// Sleeps until the attempt `at` after `start`, raising `fail_fast`
    /// when `fast_io_fail_tmo` comes first.
    fn wait_until(&self, sched: &mut Schedule, start: Instant, at: Duration) {
        loop {
            match sched.wait(start.elapsed(), at) {
                Wait::Attempt => return,
                Wait::Sleep(d) => std::thread::sleep(d),
                Wait::FailFast => {
                    tracing::warn!(
                        addr = %self.fabric.addr(),
                        "still reconnecting after fast_io_fail_tmo ({} s): failing the I/O held",
                        sched.fast_io_fail_tmo().unwrap_or_default().as_secs_f64()
                    );
                    self.fail_fast.store(true, Ordering::Release);
                }
            }
        }
    }

    /// Every core command outstanding on the link completes with Host
    /// Pathing Error; the link's own are forgotten.
    fn fail_outstanding(&self, st: &mut LinkState<F::Conn>) {
        let Some(c) = st.conn.as_mut() else { return };
        let mut failed = Vec::new();
        for o in st.owners.iter_mut() {
            if let Some(Owner::Core(tag)) = o.take() {
                failed.push(tag);
            }
        }
        c.forget_all();
        for tag in failed {
            st.stash.push_back(Done {
                tag,
                status: path_error(),
                dw0: 0,
                data: None,
            });
        }
        st.ka = None;
    }

    /// The link is dead: mark the association lost and fail its commands.
    fn lose(&self, st: &mut LinkState<F::Conn>) {
        self.lost.store(true, Ordering::Release);
        self.fail_outstanding(st);
    }

    fn alive(st: &LinkState<F::Conn>) -> bool {
        matches!(&st.conn, Some(c) if !c.is_dead())
    }

    /// Receives on the link: the link's own completions into `internal`,
    /// the core's into `stash` (with their data; see `dest`).
    fn poll(&self, st: &mut LinkState<F::Conn>) -> u32 {
        let LinkState {
            conn,
            owners,
            internal,
            stash,
            ..
        } = st;
        let Some(c) = conn.as_mut() else { return 0 };
        let (n, r) = c.poll(&mut |wcid, cqe: Cqe, data| match owners
            .get_mut(wcid as usize)
            .and_then(Option::take)
        {
            Some(Owner::Link) => internal[wcid as usize] = Some(cqe),
            Some(Owner::Core(tag)) => stash.push_back(Done {
                tag,
                status: cqe.status >> 1,
                dw0: cqe.dw0,
                data,
            }),
            None => {}
        });
        if r.is_err() {
            self.lose(st);
        }
        n
    }

    /// Runs one of the link's own commands and waits for its completion.
    fn internal(&self, st: &mut LinkState<F::Conn>, sqe: Sqe, what: &str) -> Result<Cqe> {
        let timeout = self.opts.admin_timeout;
        if !Self::alive(st) {
            return Err(Error::Platform(format!(
                "{what}: no connection to {}",
                self.fabric.addr()
            )));
        }
        let Some(wcid) = st.free_wcid() else {
            return Err(Error::Platform(format!("{what}: all admin slots busy")));
        };
        if let Err(e) = st.send(wcid, Owner::Link, sqe, CapsuleData::None) {
            self.lose(st);
            return Err(e);
        }
        st.internal[wcid as usize] = None;
        let start = Instant::now();
        loop {
            self.poll(st);
            if let Some(c) = st.internal[wcid as usize].take() {
                return Ok(c);
            }
            if !Self::alive(st) {
                return Err(Error::Platform(format!(
                    "{what}: connection to {} lost",
                    self.fabric.addr()
                )));
            }
            let el = start.elapsed();
            if el >= timeout {
                st.owners[wcid as usize] = None;
                if let Some(c) = st.conn.as_mut() {
                    c.forget(wcid);
                }
                return Err(Error::Timeout {
                    what: "Property Get/Set or Keep Alive",
                    ms: timeout.as_millis() as u64,
                });
            }
            if let Some(c) = st.conn.as_ref() {
                c.wait((timeout - el).min(Duration::from_millis(10)));
            }
        }
    }

    fn property_get(&self, off: usize, size: PropertySize) -> Result<u64> {
        let mut st = self.lock();
        self.property_get_locked(&mut st, off, size)
    }

    fn property_get_locked(
        &self,
        st: &mut LinkState<F::Conn>,
        off: usize,
        size: PropertySize,
    ) -> Result<u64> {
        let cqe = self.internal(st, property::get(off, size), "Property Get")?;
        property::got(&cqe, size)
    }

    fn property_set_locked(
        &self,
        st: &mut LinkState<F::Conn>,
        off: usize,
        size: PropertySize,
        v: u64,
    ) -> Result<()> {
        let cqe = self.internal(st, property::set(off, size, v), "Property Set")?;
        property::set_done(&cqe)
    }

    /// A register read (see the module docs for a link that is down).
    pub fn read(&self, off: usize, size: PropertySize) -> Result<u64> {
        if off == regs::off::CAP {
            return Ok(self.cap);
        }
        if self.lost.load(Ordering::Acquire) {
            // Without the mutex: a reset may be reconnecting.
            return Ok(property::down_value(off, false));
        }
        let mut st = self.lock();
        if !Self::alive(&st) {
            return Ok(property::down_value(off, st.torn_down));
        }
        match self.property_get_locked(&mut st, off, size) {
            // The link died under the read: it reads as any lost link.
            Err(e) if !Self::alive(&st) => {
                tracing::debug!(addr = %self.fabric.addr(), off, "register read: {e}");
                Ok(property::down_value(off, st.torn_down))
            }
            r => r,
        }
    }

    /// A register write (see the module docs).
    pub fn write(&self, off: usize, size: PropertySize, v: u64) -> Result<()> {
        let mut st = self.lock();
        if !Self::alive(&st) {
            if off == regs::off::CC && !Cc(v as u32).en() {
                return Ok(()); // no association: the controller is disabled
            }
            return Err(Error::Platform(format!(
                "register {off:#x}: no connection to {}",
                self.fabric.addr()
            )));
        }
        let clearing_en = off == regs::off::CC && !Cc(v as u32).en();
        let disabling = clearing_en && {
            match self.property_get_locked(&mut st, regs::off::CC, PropertySize::Four) {
                Ok(cc) => Cc(cc as u32).en(),
                // Lost under the read: no association, nothing to disable.
                Err(_) if !Self::alive(&st) => return Ok(()),
                Err(e) => return Err(e),
            }
        };
        let r = self.property_set_locked(&mut st, off, size, v);
        if clearing_en && !Self::alive(&st) {
            return Ok(()); // as above
        }
        if disabling {
            // End of this association: the next enable connects anew.
            self.fail_outstanding(&mut st);
            st.conn = None;
            st.torn_down = true;
            tracing::debug!(addr = %self.fabric.addr(), "controller disabled: association closed");
            return Ok(());
        }
        r
    }

    /// Sends a core admin command (`tag`: the core's CID) with `len` bytes
    /// of data at bus address `addr` (a buffer of the fabric's, which the
    /// core keeps for the command); the direction comes from the opcode's
    /// transfer bits.
    pub fn push(&self, tag: u16, sqe: Sqe, addr: u64, len: usize) -> Result<(), SubmitError> {
        if len > ADMIN_MAX_DATA {
            return Err(SubmitError::BufferLength {
                expected: ADMIN_MAX_DATA,
                got: len,
            });
        }
        let len = len as u32;
        let mut st = self.lock();
        // The command pushed before is no longer waited for.
        st.dest = None;
        if !Self::alive(&st) {
            st.stash.push_back(Done {
                tag,
                status: path_error(),
                dw0: 0,
                data: None,
            });
            return Ok(());
        }
        let xfer = sqe.opc & 3;
        if len > 0 && xfer != 1 && xfer != 2 {
            return Err(SubmitError::BadBuffer);
        }
        let Some(w) = st.free_wcid() else {
            return Err(SubmitError::QueueFull { limit: ADMIN_SLOTS });
        };
        let r = if len == 0 {
            st.send(w, Owner::Core(tag), sqe, CapsuleData::None)
        } else if xfer == 1 {
            if len > F::ADMIN_ICD {
                return Err(SubmitError::BufferLength {
                    expected: F::ADMIN_ICD as usize,
                    got: len as usize,
                });
            }
            // SAFETY: the core hands a buffer of the fabric's that it keeps
            // for this command; the bytes are copied into the capsule now.
            let b = unsafe { self.fabric.host_bytes(addr, len as usize) };
            st.send(w, Owner::Core(tag), sqe, CapsuleData::Bytes(b))
        } else {
            st.send(w, Owner::Core(tag), sqe, CapsuleData::Bounce(len))
        };
        if xfer == 2 && len > 0 {
            st.dest = Some((tag, addr, len));
        }
        if r.is_err() {
            self.lose(&mut st);
        }
        Ok(())
    }

    /// The core's admin completions: what was received (by anyone) since
    /// the last call, then what the link has now. Called only by the core's
    /// admin queue while it waits for the command it pushed last, so that
    /// command's buffer (`dest`) is lent to us here and nowhere else.
    pub fn reap(&self, max: u32, deliver: &mut impl FnMut(u16, u16, u32)) -> u32 {
        let mut st = self.lock();
        if (st.stash.len() as u64) < max as u64 && Self::alive(&st) {
            self.poll(&mut st);
        }
        let mut n = 0;
        while n < max {
            let Some(d) = st.stash.pop_front() else {
                break;
            };
            if let (Some(data), Some((tag, addr, len))) = (&d.data, st.dest) {
                if tag == d.tag {
                    let l = (len as usize).min(data.len());
                    // SAFETY: `dest` names the buffer of the command the
                    // core pushed last, and the core is waiting for that
                    // command's completion (this call is that wait), so the
                    // buffer is allocated and lent to this transport until
                    // the completion delivered just below; `l` is within
                    // it and within `data`.
                    unsafe { self.fabric.copy_to_host(addr, &data[..l]) };
                    st.dest = None;
                }
            }
            deliver(d.tag, d.status, d.dw0);
            n += 1;
        }
        n
    }

    pub fn ready(&self) -> bool {
        let st = self.lock();
        !st.stash.is_empty() || st.conn.as_ref().is_some_and(|c| c.has_rx())
    }

    /// The admin queue restarts empty: forget the core's commands.
    pub fn restart(&self) {
        let mut st = self.lock();
        st.stash.clear();
        st.dest = None;
        let LinkState { conn, owners, .. } = &mut *st;
        for (w, o) in owners.iter_mut().enumerate() {
            if matches!(o, Some(Owner::Core(_))) {
                *o = None;
                if let Some(c) = conn.as_mut() {
                    c.forget(w as u16);
                }
            }
        }
    }

    /// One keep-alive round (see `keepalive`): checks the answer to the
    /// last Keep Alive and sends the next.
    pub fn keep_alive(&self) {
        let mut st = self.lock();
        if !Self::alive(&st) || st.torn_down {
            return;
        }
        self.poll(&mut st);
        if let Some((w, since)) = st.ka {
            match st.internal[w as usize].take() {
                Some(c) if !c.status().is_success() => {
                    tracing::warn!(addr = %self.fabric.addr(), "Keep Alive failed: {}", c.status());
                    st.ka = None;
                }
                Some(_) => st.ka = None,
                None => {
                    if since.elapsed() >= Duration::from_millis(self.opts.kato_ms as u64) {
                        tracing::error!(
                            addr = %self.fabric.addr(),
                            kato_ms = self.opts.kato_ms,
                            "Keep Alive unanswered within KATO: association lost"
                        );
                        if let Some(c) = st.conn.as_mut() {
                            c.expire("Keep Alive unanswered");
                        }
                        self.lose(&mut st);
                    }
                    return;
                }
            }
        }
        if st.conn.is_none() {
            return;
        }
        let Some(w) = st.free_wcid() else {
            return;
        };
        st.internal[w as usize] = None;
        let r = st.send(
            w,
            Owner::Link,
            Sqe::new(KEEP_ALIVE_OPCODE, 0),
            CapsuleData::None,
        );
        if r.is_err() {
            self.lose(&mut st);
        } else {
            st.ka = Some((w, Instant::now()));
        }
    }

    /// Runs an admin command of the link's own whose data comes back in a
    /// bounce buffer (discovery: Identify, Get Log Page).
    pub fn exec_in(&self, sqe: Sqe, len: u32, what: &str) -> Result<Vec<u8>> {
        let mut st = self.lock();
        let timeout = self.opts.admin_timeout;
        let Some(c) = st.conn.as_mut().filter(|c| !c.is_dead()) else {
            return Err(Error::Platform(format!("{what}: no connection")));
        };
        let (cqe, data) = c.exchange(
            ADMIN_SLOTS as u16 - 1,
            sqe,
            CapsuleData::Bounce(len),
            timeout,
            what,
        )?;
        let s = cqe.status();
        if !s.is_success() {
            return Err(Error::Nvme {
                cmd: "Get Log Page",
                status: s,
            });
        }
        Ok(data)
    }

    /// Disables the controller (CC.EN=0) and closes the link.
    pub fn shutdown(&self) {
        let _ = self.write(regs::off::CC, PropertySize::Four, 0);
        let mut st = self.lock();
        st.conn = None;
        st.torn_down = true;
    }

    /// The controller's CAP.MQES + 1.
    pub fn max_queue_entries(&self) -> u32 {
        regs::Cap(self.cap).mqes() as u32 + 1
    }
}

#[cfg(test)]
mod tests;
