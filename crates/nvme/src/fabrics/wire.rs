//! What a fabrics transport supplies to the fabrics core: a way to open a
//! connection for a queue ([`Fabric`]) and, on one connection, a way to
//! exchange command capsules and their answers ([`Connection`]). NVMe/TCP
//! implements them over sockets (`pollux-tcp`); another fabric (RDMA)
//! would implement the same two traits and get Connect, Property Get/Set,
//! Keep Alive and the reconnect policy from the core.
//!
//! These carry the control path only (the admin queue, Connect on every
//! queue); a transport's I/O queues use their connections directly.
use std::fmt;
use std::time::Duration;

use pollux_spec::{Cqe, Sqe};

use crate::error::Result;

/// The data of a capsule the fabrics core sends.
#[derive(Clone, Copy, Debug)]
pub enum CapsuleData<'a> {
    /// No data.
    None,
    /// Bytes the connection copies into the capsule at once (in-capsule
    /// data: Connect data, an admin command's data for the controller).
    Bytes(&'a [u8]),
    /// Controller to host: `len` bytes into a buffer of the connection's
    /// own (a bounce buffer), handed back with the completion.
    Bounce(u32),
}

/// One connection of a fabrics transport, carrying one queue. Commands
/// are addressed by their wire command ID (`wcid`), below the number of
/// slots the connection was opened with; the caller keeps track of which
/// are outstanding.
pub trait Connection: Send + 'static {
    /// Queues a command capsule on wire CID `wcid`, which must not be
    /// outstanding, with `data`. An error means the connection failed.
    fn send(&mut self, wcid: u16, sqe: Sqe, data: CapsuleData<'_>) -> Result<()>;
    /// Sends what is queued, as far as the connection takes it now.
    fn flush(&mut self) -> Result<()>;
    /// Receives what the connection has and hands each completion to
    /// `f(wcid, cqe, data)`: `data` is the bounce buffer of a successful
    /// command sent with [`CapsuleData::Bounce`]. The command is no longer
    /// outstanding after. Returns the completions handed out and, if the
    /// connection failed, the error (the completions before it were handed
    /// out all the same).
    fn poll<G: FnMut(u16, Cqe, Option<Vec<u8>>)>(&mut self, f: &mut G) -> (u32, Result<()>);
    /// Sends one capsule on an otherwise idle connection and waits up to
    /// `timeout` for its answer (connection setup: Connect; discovery),
    /// returning the completion and the bounce buffer's data.
    fn exchange(
        &mut self,
        wcid: u16,
        sqe: Sqe,
        data: CapsuleData<'_>,
        timeout: Duration,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>)>;
    /// Forgets command `wcid` (it timed out): it is no longer outstanding,
    /// and an answer to it that still comes is a protocol error.
    fn forget(&mut self, wcid: u16);
    /// Forgets every command (the queue is restarted or torn down).
    fn forget_all(&mut self);
    /// True once the connection failed (closed, terminated, broke the
    /// protocol, or [`expire`](Self::expire)d).
    fn is_dead(&self) -> bool;
    /// Marks the connection failed without a word on the wire (a Keep
    /// Alive went unanswered); `what` says why.
    fn expire(&mut self, what: &str);
    /// True if received bytes wait to be handled.
    fn has_rx(&self) -> bool;
    /// Waits up to `timeout` for something to receive.
    fn wait(&self, timeout: Duration);
}

/// A fabrics transport: how to reach one controller's queues.
pub trait Fabric: Send + Sync + 'static {
    type Conn: Connection;
    /// Short name, for thread names ("tcp").
    const NAME: &'static str;
    /// In-capsule data bytes the admin queue allows (NVMe/TCP: Linux's
    /// NVME_TCP_ADMIN_CCSZ, 8 KiB).
    const ADMIN_ICD: u32;

    /// Where the controller is, for logs and errors.
    fn addr(&self) -> &dyn fmt::Display;
    /// Opens a connection for queue `qid` with `slots` command slots,
    /// ready for Connect (the transport's own setup done: NVMe/TCP's
    /// ICReq/ICResp).
    fn open(&self, qid: u16, slots: usize) -> Result<Self::Conn>;
    /// The bytes at bus address `addr` of memory this transport handed out.
    ///
    /// # Safety
    /// `addr..addr + len` must lie in a live buffer of this transport that
    /// nothing writes while the slice lives.
    unsafe fn host_bytes<'a>(&self, addr: u64, len: usize) -> &'a [u8];
    /// Copies `bytes` to bus address `addr` of memory this transport
    /// handed out.
    ///
    /// # Safety
    /// `addr..addr + bytes.len()` must lie in a live buffer of this
    /// transport that nothing else reads or writes meanwhile.
    unsafe fn copy_to_host(&self, addr: u64, bytes: &[u8]);
}
