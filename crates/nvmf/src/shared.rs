//! What every runtime thread of a target shares: the configuration, the
//! subsystems and the table of live controllers (associations). The
//! subsystems are behind a read-write lock (changed live, see `live`;
//! read at Connect and by the discovery log page) and the table behind a
//! mutex, taken only at Connect, Disconnect, close and Keep Alive expiry
//! — neither on the I/O path. Lock order: subsystems, then the table,
//! then a controller.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use pollux_runtime::ThreadCtx;

use pollux_controller::AnaPort;

use crate::auth::pool::DhPool;
use crate::auth::state::HostSecrets;
use crate::config::{AuthOptions, TransportOptions};
use crate::model::{Ctrl, Subsys};

/// Which subsystem a controller belongs to (an NVM subsystem by its
/// [`SubsysEntry::id`], which no other subsystem of the target ever
/// takes, so a deleted subsystem's controllers never find a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SubsysId {
    Discovery,
    Nvm(u64),
}

/// An NVM subsystem. Changed live by replacing it in
/// [`Shared::subsystems`] (copy on write): readers hold an `Arc` of the
/// version they read.
#[derive(Clone)]
pub(crate) struct SubsysEntry {
    pub id: u64,
    pub model: Subsys,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// The DH-HMAC-CHAP keys of hosts of `hosts` that must authenticate.
    pub host_keys: Vec<HostSecrets>,
    /// Bound addresses (a configured port 0 resolved).
    pub listeners: Vec<SocketAddr>,
    /// SPDK's `max_namespaces` (0: no limit of the target's own).
    pub max_namespaces: u32,
    /// The controller IDs it gives (SPDK's `min_cntlid`, `max_cntlid`).
    pub cntlids: (u16, u16),
    /// The ANA states through each listener (shared by every version of
    /// the entry, and by the controllers connected through it).
    pub ana_ports: Vec<(SocketAddr, Arc<AnaPort>)>,
}

impl SubsysEntry {
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// The ANA states through listener `l`.
    pub fn ana_port(&self, l: SocketAddr) -> Option<&Arc<AnaPort>> {
        self.ana_ports.iter().find(|(a, _)| *a == l).map(|(_, p)| p)
    }
}

/// The listener of `listeners` that a connection whose local address is
/// `local` came through: the same address, or a wildcard (0.0.0.0, ::)
/// one on its port.
pub(crate) fn listener_of(listeners: &[SocketAddr], local: SocketAddr) -> Option<SocketAddr> {
    let wildcard = |l: &SocketAddr| {
        l.ip().is_unspecified() && l.port() == local.port() && l.is_ipv4() == local.is_ipv4()
    };
    listeners
        .iter()
        .find(|l| **l == local)
        .or_else(|| listeners.iter().find(|l| wildcard(l)))
        .copied()
}

/// Where a queue's connection lives: runtime thread and connection id,
/// and how its transport closes it there; the listener it came through
/// and the host's address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnRef {
    pub thread: usize,
    pub conn: u64,
    pub close: fn(&mut ThreadCtx, u64),
    pub listener: SocketAddr,
    pub peer: SocketAddr,
    /// How its transport delivers a controller's asynchronous events
    /// there (an admin queue's).
    pub events: fn(&mut ThreadCtx, u64),
}

pub(crate) struct CtrlEntry {
    pub subsys: SubsysId,
    pub hostnqn: String,
    /// The Connect data's HOSTID.
    pub hostid: [u8; 16],
    pub ctrl: Arc<Mutex<Ctrl>>,
    /// The admin queue's connection (asynchronous events go there).
    pub admin: ConnRef,
    /// Connected I/O queues: (QID, connection).
    pub io: Vec<(u16, ConnRef)>,
}

#[derive(Default)]
pub(crate) struct CtrlTable {
    next: u16,
    pub map: HashMap<u16, CtrlEntry>,
}

impl CtrlTable {
    /// Registers a controller under a fresh ID of `min..=max` (at most
    /// 1..=FFEFh; the IDs after the last one given first), `None` when
    /// every ID of the range is taken.
    pub fn insert(
        &mut self,
        (min, max): (u16, u16),
        make: impl FnOnce(u16) -> CtrlEntry,
    ) -> Option<u16> {
        let (min, max) = (
            min.max(crate::config::CNTLID_MIN),
            max.min(crate::config::CNTLID_MAX),
        );
        let mut id = self.next;
        for _ in min..=max {
            id = if id >= max || id < min { min } else { id + 1 };
            if !self.map.contains_key(&id) {
                self.next = id;
                self.map.insert(id, make(id));
                return Some(id);
            }
        }
        None
    }
}

pub(crate) struct Shared {
    pub opts: TransportOptions,
    /// The NVM subsystems, in creation order.
    pub subsystems: RwLock<Vec<Arc<SubsysEntry>>>,
    pub discovery: Subsys,
    /// Every bound listener, in binding order.
    pub listeners: RwLock<Vec<SocketAddr>>,
    /// The discovery log's generation counter: one more at each change of
    /// the subsystems or listeners.
    pub genctr: AtomicU64,
    /// The digests and DH groups DH-HMAC-CHAP offers.
    pub auth: AuthOptions,
    /// Where DH-HMAC-CHAP's Diffie-Hellman work runs (off the reactor
    /// threads).
    pub dh: Arc<DhPool>,
    pub ctrls: Mutex<CtrlTable>,
    /// Connections bound to an NVM subsystem (at most
    /// `opts.max_connections`; see [`DataSlot`]).
    pub data_conns: AtomicUsize,
}

impl Shared {
    /// The subsystems (a poisoned lock is taken over: each change is one
    /// replacement of the list's contents).
    pub fn subsystems(&self) -> RwLockReadGuard<'_, Vec<Arc<SubsysEntry>>> {
        self.subsystems.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subsystems_mut(&self) -> RwLockWriteGuard<'_, Vec<Arc<SubsysEntry>>> {
        self.subsystems.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The bound listeners.
    pub fn listeners(&self) -> Vec<SocketAddr> {
        self.listeners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The subsystem named `nqn` in `subs` (the discovery subsystem: no
    /// entry).
    pub fn find(
        &self,
        subs: &[Arc<SubsysEntry>],
        nqn: &str,
    ) -> Option<(SubsysId, Option<Arc<SubsysEntry>>)> {
        if nqn == self.discovery.nqn() {
            return Some((SubsysId::Discovery, None));
        }
        subs.iter()
            .find(|s| s.model.nqn() == nqn)
            .map(|s| (SubsysId::Nvm(s.id), Some(s.clone())))
    }

    /// The controller table (a poisoned lock is taken over: the table
    /// stays consistent, each change is a single insert or remove).
    pub fn table(&self) -> MutexGuard<'_, CtrlTable> {
        self.ctrls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes controller `cntlid` and closes its I/O queues' connections
    /// (on their threads).
    pub fn teardown(&self, ctx: &mut ThreadCtx, cntlid: u16) {
        let entry = self.table().map.remove(&cntlid);
        let Some(e) = entry else {
            return;
        };
        tracing::info!(cntlid, host = %e.hostnqn, io_queues = e.io.len(), "controller torn down");
        for (_, r) in e.io {
            let (conn, close) = (r.conn, r.close);
            if let Err(err) = ctx.send(r.thread, move |ctx| close(ctx, conn)) {
                tracing::warn!(
                    thread = r.thread,
                    "closing an I/O queue of controller {cntlid}: {err}"
                );
            }
        }
    }

    /// Closes the I/O queues' connections of controller `cntlid` (on
    /// their threads), which a reset or shutdown stops: each leaves the
    /// controller's entry as it closes (`Qpair::detach`), and the
    /// controller completes the reset or shutdown once none is left (see
    /// `model::Ctrl`).
    pub fn stop_io_queues(&self, ctx: &mut ThreadCtx, cntlid: u16) {
        let queues = match self.table().map.get(&cntlid) {
            Some(e) => e.io.clone(),
            None => return,
        };
        tracing::info!(
            cntlid,
            io_queues = queues.len(),
            "controller reset or shut down: closing its I/O queues"
        );
        for (qid, r) in queues {
            let (conn, close) = (r.conn, r.close);
            if let Err(err) = ctx.send(r.thread, move |ctx| close(ctx, conn)) {
                tracing::warn!(
                    cntlid,
                    qid,
                    thread = r.thread,
                    "closing an I/O queue: {err}"
                );
                if let Some(e) = self.table().map.get_mut(&cntlid) {
                    e.io.retain(|(q, _)| *q != qid);
                }
            }
        }
    }
}

/// A connection's place among those bound to an NVM subsystem
/// (`Shared::data_conns`), given back when dropped unless kept.
pub(crate) struct DataSlot<'a>(Option<&'a AtomicUsize>);

impl<'a> DataSlot<'a> {
    /// A place, if fewer than `max` are taken.
    pub fn take(n: &'a AtomicUsize, max: usize) -> Option<DataSlot<'a>> {
        n.fetch_update(Relaxed, Relaxed, |v| (v < max).then_some(v + 1))
            .ok()
            .map(|_| DataSlot(Some(n)))
    }

    /// Keeps the place (the connection gives it back with
    /// [`DataSlot::give_back`]).
    pub fn keep(mut self) {
        self.0 = None;
    }

    /// Gives back a place kept earlier.
    pub fn give_back(n: &AtomicUsize) {
        n.fetch_sub(1, Relaxed);
    }
}

impl Drop for DataSlot<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0 {
            n.fetch_sub(1, Relaxed);
        }
    }
}

/// Locks a controller (poison taken over, as the table).
pub(crate) fn lock(c: &Mutex<Ctrl>) -> MutexGuard<'_, Ctrl> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}
