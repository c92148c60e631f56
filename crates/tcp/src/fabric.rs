//! NVMe/TCP as a fabric of the host core's fabrics layer
//! (`pollux_nvme::fabrics`): connections are TCP connections set up with
//! ICReq/ICResp, capsules travel as PDUs. Connect, Property Get/Set, Keep
//! Alive and reconnecting are the core's.
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use pollux_nvme::error::{Error, Result};
use pollux_nvme::fabrics::{CapsuleData, Connection, Fabric};
use pollux_spec::tcp::Digests;
use pollux_spec::{Cqe, Sqe};

use crate::conn::{Conn, ConnError, ConnErrorKind, Data, Slot};
use crate::mem;

/// In-capsule data allowed on the admin queue (Linux: NVME_TCP_ADMIN_CCSZ).
pub(crate) const ADMIN_ICD: u32 = 8192;

/// Where and how to open NVMe/TCP connections to one controller.
#[derive(Clone, Debug)]
pub(crate) struct TcpFabric {
    pub addr: SocketAddr,
    pub digests: Digests,
    /// Bound on a TCP connect and on connection setup.
    pub connect_timeout: Duration,
    /// `SO_BUSY_POLL` microseconds (0: not set).
    pub busy_poll_us: u32,
    /// How the I/O queues' sockets are driven once connected.
    pub sock_impl: crate::SockImpl,
    /// With `uring`: how each connection's ring is set up.
    pub uring: crate::UringOptions,
}

pub(crate) fn conn_error(e: ConnError) -> Error {
    Error::Io(std::io::Error::other(e))
}

impl Fabric for TcpFabric {
    type Conn = Conn;
    const NAME: &'static str = "tcp";
    const ADMIN_ICD: u32 = ADMIN_ICD;

    fn addr(&self) -> &dyn fmt::Display {
        &self.addr
    }

    fn open(&self, qid: u16, slots: usize) -> Result<Conn> {
        let mut conn = Conn::connect(
            self.addr,
            qid,
            self.digests,
            slots,
            self.connect_timeout,
            self.busy_poll_us,
        )
        .map_err(conn_error)?;
        conn.set_icd_max(ADMIN_ICD);
        Ok(conn)
    }

    unsafe fn host_bytes<'a>(&self, addr: u64, len: usize) -> &'a [u8] {
        // SAFETY: the caller's contract (a live buffer of this transport).
        unsafe { mem::slice(addr, len) }
    }

    unsafe fn copy_to_host(&self, addr: u64, bytes: &[u8]) {
        // SAFETY: the caller's contract: the range lies in a live buffer
        // of this transport that nothing else touches meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), mem::ptr(addr), bytes.len()) }
    }
}

fn data(d: CapsuleData<'_>) -> Data<'_> {
    match d {
        CapsuleData::None => Data::None,
        CapsuleData::Bytes(b) => Data::Bytes(b),
        CapsuleData::Bounce(len) => Data::InBounce { len },
    }
}

impl Connection for Conn {
    fn send(&mut self, wcid: u16, sqe: Sqe, d: CapsuleData<'_>) -> Result<()> {
        // SAFETY: no buffer address: capsule data is copied at once, data
        // for the host comes back in the slot's bounce buffer.
        unsafe { self.submit(wcid, sqe, data(d), wcid, true) }.map_err(conn_error)
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_tx().map_err(conn_error)
    }

    fn poll<G: FnMut(u16, Cqe, Option<Vec<u8>>)>(&mut self, f: &mut G) -> (u32, Result<()>) {
        let (n, r) = Conn::poll(self, u32::MAX, &mut |wcid, s: &mut Slot, cqe: Cqe| {
            let data = (s.has_bounce() && cqe.status().is_success())
                .then(|| std::mem::take(&mut s.bounce));
            f(wcid, cqe, data)
        });
        (n, r.map_err(conn_error))
    }

    fn exchange(
        &mut self,
        wcid: u16,
        sqe: Sqe,
        d: CapsuleData<'_>,
        timeout: Duration,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.exec_sync(wcid, sqe, data(d), timeout, what)
            .map_err(conn_error)
    }

    fn forget(&mut self, wcid: u16) {
        if let Some(s) = self.slots_mut().get_mut(wcid as usize) {
            s.active = false;
        }
    }

    fn forget_all(&mut self) {
        Conn::forget_all(self)
    }

    fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    fn expire(&mut self, what: &str) {
        let e = ConnError {
            addr: self.addr,
            qid: self.qid,
            kind: ConnErrorKind::Timeout,
            what: what.into(),
        };
        self.dead.get_or_insert(e);
    }

    fn has_rx(&self) -> bool {
        Conn::has_rx(self)
    }

    fn wait(&self, timeout: Duration) {
        let _ = pollux_nvme::wait_readable(&[self.fd()], Some(timeout));
    }
}
