//! pollux-tcp — NVMe over TCP as a `pollux_nvme::Transport`, the host side
//! (NVMe/TCP Transport Specification 1.0 and the fabrics parts of NVMe
//! 2.0), on the same host core as PCIe.
//!
//! What is fabrics rather than TCP (Connect, Property Get/Set, Keep
//! Alive, the reconnect policy, discovery) is the core's
//! (`pollux_nvme::fabrics`); this crate is its wire (`fabric`: a
//! connection per queue, set up with ICReq/ICResp, carrying capsules as
//! PDUs).
//!
//! - **Admin queue**: one TCP connection (ICReq/ICResp, then fabrics
//!   Connect on QID 0 with CNTLID 0xFFFF, host NQN, Host ID and subsystem
//!   NQN in the 1024-byte Connect data). Registers (CAP, VS, CC, CSTS)
//!   travel as Property Get/Set on it (the core's admin link).
//! - **I/O queues**: one connection each (Connect with QID n and the
//!   controller ID the admin Connect returned). Commands go out as command
//!   capsules with an SGL: in-capsule data (descriptor 0x01) for writes up
//!   to the controller's IOCCSZ, else a transport data block (0x5A): the
//!   controller asks for write data with R2T (answered with H2CData PDUs of
//!   at most MAXH2CDATA) and sends read data in C2HData PDUs, whose offset
//!   and length are checked against the command before a byte is copied.
//!   A C2HData with SUCCESS completes its command; so does a CapsuleResp.
//!   Header and data digests (CRC32C) when asked for (`hdgst`/`ddgst`),
//!   negotiated in ICReq. Sends are batched per poll (one writev), receives
//!   read what the socket has and parse PDUs from a per-connection buffer
//!   (`conn`). How the SQ and CQ halves share a connection: `queue`.
//!   With `sock_impl:uring` ([`SockImpl::Uring`]) an I/O queue's socket
//!   goes through an io_uring of its own instead (`uring`): the send and
//!   the receive in one `io_uring_enter` per poll, none when there is
//!   nothing to do.
//! - **Buffers** (`alloc_dma`) are ordinary page-aligned memory; their
//!   "bus address" is their virtual address (tagged; see `mem`).
//! - **Failure**: a connection that closes, a Termination Request, a PDU
//!   that fails the checks (answered with a Termination Request), or an
//!   unanswered Keep Alive breaks the queue; the core then resets the
//!   controller on a thread of its own — over fabrics a new association:
//!   the admin queue and every I/O queue reconnect, at once and then every
//!   `reconnect_delay` for up to `ctrl_loss_tmo` (Linux's policy and
//!   defaults) — while I/O is held: the commands that were outstanding are
//!   sent again on the new connections (their buffers stay with the queue
//!   pair), new ones wait in the backlog. If `fast_io_fail_tmo` passes
//!   first, what is held fails with `FastFail`; if `ctrl_loss_tmo` passes,
//!   with `ControllerFailed`. See `pollux_nvme::fabrics` and `queue`.
//! - **Keep-alive**: a thread per controller sends Keep Alive every
//!   KATO/2 on the admin connection (`pollux_nvme::fabrics::KeepAlive`).
//! - **Discovery**: [`discover`] reads the Discovery Log Page (0x70) from a
//!   discovery controller.
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pollux_nvme::dma::DmaBuffer;
use pollux_nvme::error::{Error, Result};
use pollux_nvme::fabrics::{self, AdminLink, AuthOptions, FabricsOptions, KeepAlive};
use pollux_nvme::{AdminExec, QueueSpec, Registers, Transport};
use pollux_spec::fabrics::{DiscoveryLogEntry, PropertySize, DISCOVERY_NQN};
use pollux_spec::identify::IdentifyController;
use pollux_spec::tcp::Digests;

pub mod bufring;
mod conn;
pub mod engine;
mod fabric;
pub mod hostnqn;
pub mod mapping;
mod mem;
mod queue;
pub mod sockopt;
mod uring;

pub use conn::{ConnError, ConnErrorKind};
pub use pollux_spec::tcp::Digests as TcpDigests;
pub use queue::{TcpCq, TcpSq};
pub use uring::{UringOptions, RX_BUFFERS, RX_BUFFER_SIZE, RX_BUFFER_SIZE_MAX};

use fabric::TcpFabric;

/// The controller handle over TCP.
pub type Controller = pollux_nvme::Controller<TcpTransport>;
/// An I/O queue pair over TCP.
pub type QueuePair = pollux_nvme::QueuePair<TcpTransport>;

/// Where and how to reach an NVMe/TCP controller.
#[derive(Clone, Debug)]
pub struct TcpOptions {
    /// Address and port (`traddr`, `trsvcid`).
    pub addr: SocketAddr,
    /// Subsystem NQN (`subnqn`).
    pub subnqn: String,
    /// Host NQN (`hostnqn`; default [`hostnqn::default_host`]).
    pub hostnqn: String,
    /// Host Identifier.
    pub hostid: [u8; 16],
    /// Header and data digests (`hdgst`, `ddgst`).
    pub digests: Digests,
    /// Keep Alive Timeout in ms (0: none); Keep Alive goes out every KATO/2.
    pub kato_ms: u32,
    /// Bound on a TCP connect and on connection setup.
    pub connect_timeout: Duration,
    /// How long a lost controller is reconnected before it is given up
    /// (`ctrl_loss_tmo`; None: forever, Linux's -1). Default 600 s, Linux's
    /// NVMF_DEF_CTRL_LOSS_TMO. (The reset thread holds the controller: one
    /// dropped while it reconnects is released when the reconnect ends.)
    pub ctrl_loss_tmo: Option<Duration>,
    /// Time between reconnect attempts (`reconnect_delay`; not zero; the
    /// first attempt is immediate). Default 10 s, Linux's
    /// NVMF_DEF_RECONNECT_DELAY.
    pub reconnect_delay: Duration,
    /// I/O held while reconnecting fails (`IoError::FastFail`) once the
    /// reconnect has taken this long (`fast_io_fail_tmo`). Default None
    /// (Linux's -1, NVMF_DEF_FAIL_FAST_TMO): I/O is held until the
    /// reconnect succeeds or `ctrl_loss_tmo` passes.
    pub fast_io_fail_tmo: Option<Duration>,
    /// Bound on Connect and on Property Get/Set.
    pub admin_timeout: Duration,
    /// Keep SQ flow control on the I/O queues (`sqflow:1`). Off (the
    /// default), Connect asks the controller to disable it, so a read ends
    /// with C2HData's SUCCESS flag rather than a response capsule too.
    pub sq_flow: bool,
    /// `SO_BUSY_POLL` microseconds on every connection (`busy_poll:US`;
    /// 0, the default: off). See [`sockopt::set_busy_poll`].
    pub busy_poll_us: u32,
    /// How the I/O queues' sockets are driven (`sock_impl:posix|uring`;
    /// default `posix`). The admin queue's is always `posix`.
    pub sock_impl: SockImpl,
    /// With `uring`: how each connection's ring is set up
    /// (`uring_direct:0|1`, `uring_rx_buffers:N`,
    /// `uring_rx_buffer_size:BYTES`).
    pub uring: UringOptions,
    /// In-band authentication (DH-HMAC-CHAP) on every queue: the host's
    /// and the controller's secrets, the digests and groups offered.
    pub auth: AuthOptions,
}

impl TcpOptions {
    /// Options for `addr` and `subnqn` with this machine's host NQN/ID, no
    /// digests, KATO 5 s, and Linux's reconnect defaults (a new attempt
    /// every 10 s for 600 s, I/O held meanwhile).
    pub fn new(addr: SocketAddr, subnqn: &str) -> TcpOptions {
        let (hostnqn, hostid) = hostnqn::default_host();
        TcpOptions {
            addr,
            subnqn: subnqn.to_string(),
            hostnqn,
            hostid,
            digests: Digests::NONE,
            kato_ms: 5000,
            connect_timeout: Duration::from_secs(5),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
            reconnect_delay: Duration::from_secs(10),
            fast_io_fail_tmo: None,
            admin_timeout: Duration::from_secs(5),
            sq_flow: false,
            busy_poll_us: 0,
            sock_impl: SockImpl::Posix,
            uring: UringOptions::default(),
            auth: AuthOptions::default(),
        }
    }

    /// The connections' part (address, digests) and the fabrics core's.
    fn split(self) -> (TcpFabric, FabricsOptions) {
        let fabric = TcpFabric {
            addr: self.addr,
            digests: self.digests,
            connect_timeout: self.connect_timeout,
            busy_poll_us: self.busy_poll_us,
            sock_impl: self.sock_impl,
            uring: self.uring,
        };
        let opts = FabricsOptions {
            subnqn: self.subnqn,
            hostnqn: self.hostnqn,
            hostid: self.hostid,
            kato_ms: self.kato_ms,
            ctrl_loss_tmo: self.ctrl_loss_tmo,
            reconnect_delay: self.reconnect_delay,
            fast_io_fail_tmo: self.fast_io_fail_tmo,
            admin_timeout: self.admin_timeout,
            sq_flow: self.sq_flow,
            auth: self.auth,
        };
        (fabric, opts)
    }
}

/// How sockets are driven, by SPDK's `sock_impl` names: the host's I/O
/// queues (`TcpOptions::sock_impl`) and the target's threads
/// (`pollux_nvmf`'s transport options) take the same two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SockImpl {
    /// Non-blocking sockets (the host: `writev` and `read` per poll).
    #[default]
    Posix,
    /// io_uring (the host: one per connection, the send and the deferred
    /// receive work in one `io_uring_enter`, a multishot receive into
    /// provided buffers, the socket a registered file; Linux 6.1 or
    /// later).
    Uring,
}

impl SockImpl {
    /// The implementation called `name` (`posix`, `uring`).
    pub fn from_name(name: &str) -> Option<SockImpl> {
        match name {
            "posix" => Some(SockImpl::Posix),
            "uring" => Some(SockImpl::Uring),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            SockImpl::Posix => "posix",
            SockImpl::Uring => "uring",
        }
    }
}

/// Resolves `traddr`/`trsvcid` into a socket address, naming them on error.
pub fn resolve(traddr: &str, trsvcid: &str) -> Result<SocketAddr> {
    let port: u16 = trsvcid
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("trsvcid '{trsvcid}' is not a TCP port")))?;
    (traddr, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("traddr '{traddr}': {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArgument(format!("traddr '{traddr}' has no address")))
}

/// A controller reached over NVMe/TCP: the control path. See the crate docs.
pub struct TcpTransport {
    link: Arc<AdminLink<TcpFabric>>,
    /// In-capsule data bytes for I/O writes (from Identify IOCCSZ).
    icd_max: AtomicU32,
    keepalive: Option<KeepAlive>,
}

impl TcpTransport {
    /// Connects the admin queue (ICReq/ICResp, Connect) and starts
    /// keep-alive. `Controller::new` (or [`open`]) does the rest.
    pub fn connect(opts: TcpOptions) -> Result<TcpTransport> {
        let (fabric, fopts) = opts.split();
        let link = Arc::new(AdminLink::connect(fabric, fopts)?);
        let keepalive = KeepAlive::start(&link);
        Ok(TcpTransport {
            link,
            icd_max: AtomicU32::new(0),
            keepalive,
        })
    }

    /// The controller ID of the current association.
    pub fn cntlid(&self) -> u16 {
        self.link.cntlid()
    }

    /// True while the association is lost and not yet re-established.
    pub fn is_lost(&self) -> bool {
        self.link.lost.load(Ordering::Acquire)
    }

    /// True while a reset is connecting a new association (see
    /// `TcpOptions::ctrl_loss_tmo`).
    pub fn is_reconnecting(&self) -> bool {
        self.link.reconnecting.load(Ordering::Acquire)
    }

    /// Reconnect attempts made since the controller was opened.
    pub fn reconnect_attempts(&self) -> u64 {
        self.link.attempts.load(Ordering::Relaxed)
    }

    /// An I/O queue's connection, connected: on io_uring from now on if
    /// asked (`sock_impl:uring`).
    fn wire_up(&self, conn: &mut conn::Conn) -> Result<()> {
        match self.link.fabric.sock_impl {
            SockImpl::Posix => Ok(()),
            SockImpl::Uring => conn
                .use_uring(&self.link.fabric.uring)
                .map_err(fabric::conn_error),
        }
    }

    /// The socket implementation of the I/O queues.
    pub fn sock_impl(&self) -> SockImpl {
        self.link.fabric.sock_impl
    }

    /// In-capsule data bytes I/O writes may carry.
    pub fn in_capsule_limit(&self) -> u32 {
        self.icd_max.load(Ordering::Relaxed)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.keepalive.take();
    }
}

/// Connects and brings up the controller at `opts`.
pub fn open(opts: TcpOptions, copts: pollux_nvme::ControllerOptions) -> Result<Controller> {
    Controller::new(TcpTransport::connect(opts)?, copts)
}

/// Property Get/Set on the admin connection. A write is `unsafe` as on any
/// transport (`Registers`): here, clearing CC.EN ends the association and
/// fails the admin commands outstanding on it (`link`).
impl Registers for TcpTransport {
    fn read32(&self, off: usize) -> Result<u32> {
        Ok(self.link.read(off, PropertySize::Four)? as u32)
    }
    unsafe fn write32(&self, off: usize, v: u32) -> Result<()> {
        self.link.write(off, PropertySize::Four, v as u64)
    }
    fn read64(&self, off: usize) -> Result<u64> {
        self.link.read(off, PropertySize::Eight)
    }
    unsafe fn write64(&self, off: usize, v: u64) -> Result<()> {
        self.link.write(off, PropertySize::Eight, v)
    }
}

impl Transport for TcpTransport {
    type Sq = TcpSq;
    type Cq = TcpCq;
    type Regs = TcpTransport;

    fn describe(&self) -> String {
        format!("tcp {} {}", self.link.fabric.addr, self.link.opts.subnqn)
    }

    fn regs(&self) -> &TcpTransport {
        self
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        mem::alloc(len)
    }

    fn relax(&self) {
        std::thread::sleep(Duration::from_micros(20));
    }

    /// Restarting a queue closes its connection: nothing is copied into
    /// the buffers of its commands afterwards, whatever the target does.
    fn restart_stops_transfers(&self) -> bool {
        true
    }

    fn max_queue_entries(&self) -> u32 {
        self.link.max_queue_entries()
    }

    unsafe fn admin_queues(&self, _entries: u16) -> Result<(TcpSq, TcpCq)> {
        Ok(queue::admin_pair(self.link.clone()))
    }

    unsafe fn attach_admin(&self, _sq: &TcpSq, _cq: &TcpCq) -> Result<()> {
        self.link.ensure()
    }

    unsafe fn configure(
        &self,
        _admin: &mut AdminExec<'_>,
        ident: &IdentifyController,
    ) -> Result<()> {
        // IOCCSZ: capsule size in 16-byte units, the 64-byte SQE included.
        let icd = (ident.ioccsz as u64 * 16).saturating_sub(64).min(1 << 20) as u32;
        self.icd_max.store(icd, Ordering::Relaxed);
        tracing::debug!(
            ioccsz = ident.ioccsz,
            icd,
            cntlid = self.cntlid(),
            "NVMe/TCP controller configured"
        );
        Ok(())
    }

    unsafe fn create_io_queues(
        &self,
        _admin: &mut AdminExec<'_>,
        spec: &QueueSpec,
    ) -> Result<(TcpSq, TcpCq)> {
        let (mut conn, _) = self.link.connect_queue(
            spec.qid,
            spec.sq_entries,
            self.cntlid(),
            spec.depth as usize,
        )?;
        conn.set_icd_max(self.icd_max.load(Ordering::Relaxed));
        self.wire_up(&mut conn)?;
        Ok(queue::io_pair(
            conn,
            spec.depth,
            spec.sq_entries,
            spec.cq_entries,
            spec.max_transfer as usize,
            self.link.lost.clone(),
            spec.interrupts,
        ))
    }

    unsafe fn recreate_io_queues(
        &self,
        _admin: &mut AdminExec<'_>,
        qid: u16,
        _sq: &mut TcpSq,
        cq: &mut TcpCq,
    ) -> Result<()> {
        let Some(q) = cq.io() else {
            return Err(Error::InvalidArgument(format!(
                "queue {qid} is not an I/O queue"
            )));
        };
        let (depth, entries) = (q.depth(), q.sq_entries());
        let (mut conn, _) = self
            .link
            .connect_queue(qid, entries, self.cntlid(), depth)?;
        conn.set_icd_max(self.icd_max.load(Ordering::Relaxed));
        self.wire_up(&mut conn)?;
        q.attach(conn);
        Ok(())
    }

    unsafe fn delete_io_queues(&self, _admin: &mut AdminExec<'_>, _qid: u16) -> Result<()> {
        // The queue's connection closes when the queue pair drops it.
        Ok(())
    }

    fn reconnects(&self) -> bool {
        true
    }

    fn fail_held_io(&self) -> bool {
        self.link.fail_fast.load(Ordering::Acquire)
    }
}

/// Reads the Discovery Log Page of the discovery controller at `opts.addr`
/// (`opts.subnqn` is replaced by the discovery NQN unless it names another
/// discovery subsystem): connect, enable, Get Log Page 0x70 (header, then
/// every entry), disable.
pub fn discover(mut opts: TcpOptions) -> Result<Vec<DiscoveryLogEntry>> {
    if opts.subnqn.is_empty() {
        opts.subnqn = DISCOVERY_NQN.to_string();
    }
    opts.kato_ms = 0;
    let (fabric, fopts) = opts.split();
    let link = AdminLink::connect(fabric, fopts)?;
    fabrics::discover(&link)
}
