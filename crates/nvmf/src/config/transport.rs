//! The transport options and the bounds the data path relies on.
use std::time::Duration;

use super::error::ConfigError;

/// Transport options (SPDK's `nvmf_create_transport` names where SPDK has
/// one) and the switches of the data path's techniques.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportOptions {
    /// Entries of an I/O queue at most (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// Entries of the admin queue at most.
    pub max_aq_depth: u16,
    /// I/O queues per controller at most.
    pub max_io_qpairs_per_ctrlr: u16,
    /// In-capsule data bytes of an I/O command capsule (IOCCSZ).
    pub in_capsule_data_size: u32,
    /// In-capsule data bytes of an admin command capsule (NVMe/TCP: at
    /// least 8 KiB; pollux-specific, JSON `admin_in_capsule_data_size`).
    pub admin_in_capsule_data_size: u32,
    /// Largest transfer of one command (MDTS), a power of two ≥ 4 KiB.
    pub max_io_size: u32,
    /// MAXH2CDATA announced in ICResp: the most data bytes of one
    /// H2CData PDU (pollux-specific, JSON `max_h2c_data`; SPDK announces
    /// its `max_io_size`).
    pub max_h2c_data: u32,
    /// Connections bound to an NVM subsystem (a Connect accepted) at
    /// once at most; a Connect beyond is refused (Controller Busy;
    /// pollux-specific, JSON `max_connections`).
    pub max_connections: usize,
    /// Connections not bound to an NVM subsystem (handshake not done, or
    /// a discovery controller's) at once at most, split evenly between
    /// the threads; a new connection beyond a thread's share closes the
    /// one of them that has received nothing for longest, so such
    /// connections cannot take data hosts' places (pollux-specific; JSON
    /// `max_unbound_connections`).
    pub max_unbound_connections: usize,
    /// Keep Alive granularity, 100 ms units (KAS).
    pub kas: u16,
    /// Bytes of each connection's receive buffer (pollux-specific, JSON
    /// `rx_buffer_size`).
    pub rx_buffer: usize,
    /// Place each connection on the runtime thread whose core receives
    /// its packets (`SO_INCOMING_CPU`), else round robin (pollux-specific,
    /// JSON `incoming_cpu`, CLI `--incoming-cpu`).
    pub incoming_cpu: bool,
    /// Idle threads sleep in epoll on their sockets; off: they poll
    /// (pollux-specific, JSON `epoll_idle`, CLI `--no-epoll-idle`).
    pub epoll_idle: bool,
    /// Receive large data straight into the command's buffer (one
    /// `readv` into buffer and receive buffer) instead of copying it
    /// (pollux-specific, JSON `direct_receive`, CLI
    /// `--no-direct-receive`).
    pub direct_receive: bool,
    /// `posix`: a connection whose receive came up empty is not read
    /// again until the thread's epoll set reports its socket readable
    /// (one `epoll_wait` per poll answers for all the thread's waiting
    /// sockets; an empty `recv` takes the socket's lock, which the peer's
    /// transmit needs too). Off (the default, measured: it halves the
    /// time spent spinning on that lock under SPDK's perf but gains no
    /// I/Os there, and costs QD 1 an `epoll_wait` per I/O; see
    /// bench/RESULTS.md): every poll reads every connection.
    pub epoll_receive: bool,
    /// Each connection's socket send buffer in bytes (`SO_SNDBUF`, which
    /// the kernel doubles; at most `net.core.wmem_max`), or 0: the
    /// kernel's own, tuned as it goes (the default). Pollux-specific (CLI
    /// `--send-buffer`).
    ///
    /// Over loopback a fixed 192 KiB keeps the data in flight within the
    /// caches: 4 KiB reads at QD 128 stay at the high one of the two rates
    /// they otherwise alternate between, and 128 KiB reads at QD 32 gain
    /// about half (bench/RESULTS.md). It is not the default because it
    /// also caps a connection at about this many bytes per network round
    /// trip (192 KiB at 100 µs is 1.9 GB/s, under 25 GbE), which loopback
    /// cannot measure.
    pub send_buffer: u32,
    /// Most iovecs in one `sendmsg` (1..=[`MAX_SEND_IOV`]; JSON
    /// `send_iov`, pollux-specific). Each response is one or two (header,
    /// data): fewer, larger sends cost the kernel less per byte.
    pub send_iov: usize,
    /// A connection whose ICReq has not arrived this long after it was
    /// accepted is closed (pollux-specific; JSON `icreq_timeout_ms`).
    pub icreq_timeout: Duration,
    /// A connection whose queue is not connected (Fabrics Connect
    /// accepted) this long after its ICResp is closed (pollux-specific;
    /// JSON `connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// A queue whose host must authenticate (DH-HMAC-CHAP) and has not
    /// succeeded this long after Connect is closed with its controller
    /// (pollux-specific; JSON `auth_timeout_ms`).
    pub auth_timeout: Duration,
    /// Data buffers of the whole target: `num_shared_buffers` units of
    /// `io_unit_size` bytes (SPDK's names). A command whose data needs a
    /// buffer the budget cannot give waits (no R2T sent yet).
    pub num_shared_buffers: u32,
    pub io_unit_size: u32,
    /// Free buffers each thread keeps, in `io_unit_size` units (SPDK's
    /// `buf_cache_size`; None: SPDK's default, three quarters of the
    /// pool split between the threads).
    pub buf_cache_size: Option<u32>,
    /// A command whose data (H2CData after its R2T) has not all arrived
    /// this long after the R2T completes with Transient Transport Error,
    /// and a connection whose host takes none of the data queued for it
    /// this long is closed, so their buffers come back (pollux-specific;
    /// JSON `data_timeout_ms`).
    pub data_timeout: Duration,
    /// `SO_BUSY_POLL` microseconds on every accepted connection (0: off;
    /// pollux-specific; JSON `busy_poll_us`). The kernel honours it only
    /// for sockets fed by a NAPI context with an id (a network card's
    /// queue), not on loopback.
    pub busy_poll_us: u32,
    /// The socket implementation of the target's threads (SPDK's
    /// vocabulary: `posix`, `uring`; JSON `sock_impl`, CLI `--sock-impl`).
    pub sock_impl: SockImpl,
    /// io_uring: the sockets are registered files of each thread's ring
    /// (JSON `uring_fixed_files`).
    pub uring_fixed_files: bool,
    /// io_uring: provided receive buffers of each thread's ring, and their
    /// size in bytes (multishot receive picks them; JSON
    /// `uring_rx_buffers`, `uring_rx_buffer_size`).
    pub uring_rx_buffers: u16,
    pub uring_rx_buffer_size: u32,
    /// io_uring: a connection's send of at least this many bytes is a
    /// zero-copy `SENDMSG_ZC` (the kernel pins the pages and sends from
    /// them; the thread's poll waits for the notification that it is
    /// done with them); 0: off, every send copies (JSON
    /// `uring_zcopy_threshold`).
    pub uring_zcopy_threshold: u32,
    /// io_uring: bytes of each thread's data buffers kept in one region
    /// registered with its ring (`IORING_REGISTER_BUFFERS`), so that a
    /// zero-copy send from them names the registered buffer
    /// (`IORING_RECVSEND_FIXED_BUF`, Linux 6.15+) and the kernel does not
    /// pin the pages per send; the headers sent with the data are copied
    /// into the region's staging part. 0: off. Needs
    /// `uring_zcopy_threshold` (only zero-copy sends use it). Buffers the
    /// region cannot hold come from the heap and are sent as before
    /// (JSON `uring_registered_buffers`).
    pub uring_registered_buffers: u32,
}

/// The target's socket implementation, by SPDK's names (`posix`,
/// `uring`; the host's vocabulary too). For the target, `Posix`:
/// non-blocking sockets, `recv`/`readv` and `sendmsg` per connection, idle
/// threads asleep in epoll on the sockets; `Uring`: one io_uring per
/// thread, multishot receive into provided buffers, the sends of all
/// connections submitted in one `io_uring_enter` per poll, idle threads
/// asleep in epoll on the ring.
pub use pollux_tcp::SockImpl;

/// Most iovecs in one `sendmsg`: a header and a data segment for each
/// command of a queue of depth 256, so a full queue's responses go out in
/// one call.
pub const MAX_SEND_IOV: usize = 512;

/// Entries an admin or I/O queue may be given (`max_aq_depth`,
/// `max_queue_depth`).
pub const QUEUE_DEPTHS: std::ops::RangeInclusive<u16> = 2..=4096;

/// Most bytes of one H2CData PDU accepted (`max_h2c_data`): the largest
/// `max_io_size`.
pub const MAX_H2C_DATA: u32 = 16 << 20;

/// Most bytes of a connection's receive buffer accepted (`rx_buffer`,
/// JSON `rx_buffer_size`).
pub const MAX_RX_BUFFER: usize = 16 << 20;

/// Most connections accepted for `max_connections` and
/// `max_unbound_connections`.
pub const MAX_CONNECTIONS: usize = 1 << 20;

/// Longest handshake timeout accepted.
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3600);

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            max_queue_depth: 128,
            max_aq_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            in_capsule_data_size: 4096,
            admin_in_capsule_data_size: 8192,
            max_io_size: 128 << 10,
            max_h2c_data: 128 << 10,
            max_connections: 1024,
            max_unbound_connections: 256,
            kas: 1,
            rx_buffer: 64 << 10,
            incoming_cpu: false,
            epoll_idle: true,
            direct_receive: true,
            epoll_receive: false,
            send_buffer: 0,
            send_iov: MAX_SEND_IOV,
            icreq_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(10),
            num_shared_buffers: 511,
            io_unit_size: 128 << 10,
            buf_cache_size: None,
            data_timeout: Duration::from_secs(30),
            busy_poll_us: 0,
            sock_impl: SockImpl::Posix,
            uring_fixed_files: true,
            uring_rx_buffers: 512,
            uring_rx_buffer_size: 16 << 10,
            uring_zcopy_threshold: 0,
            uring_registered_buffers: 0,
        }
    }
}

/// Largest `uring_zcopy_threshold` accepted.
const MAX_ZCOPY_THRESHOLD: u32 = 1 << 30;

/// The sizes `uring_registered_buffers` may take (besides 0, off): a
/// registered buffer is at most 1 GiB.
pub const REGISTERED_BUFFERS: std::ops::RangeInclusive<u32> = (1 << 20)..=(1 << 30);

/// Largest data buffer pool accepted.
const MAX_POOL_BYTES: u64 = 1 << 40;

impl TransportOptions {
    /// Bytes of data buffers the target may hold (`num_shared_buffers` x
    /// `io_unit_size`).
    pub fn pool_bytes(&self) -> u64 {
        self.num_shared_buffers as u64 * self.io_unit_size as u64
    }

    /// Bytes of free buffers each of `threads` threads may cache.
    pub(crate) fn cache_bytes(&self, threads: usize) -> u64 {
        let units = match self.buf_cache_size {
            Some(c) => c as u64,
            None => self.num_shared_buffers as u64 * 3 / 4 / threads.max(1) as u64,
        };
        units * self.io_unit_size as u64
    }

    /// Checks the bounds the data path relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |option, value: u64, why: &str| {
            Err(ConfigError::Transport {
                option,
                value,
                why: why.into(),
            })
        };
        let depths = format!("must be {}..={}", QUEUE_DEPTHS.start(), QUEUE_DEPTHS.end());
        if !QUEUE_DEPTHS.contains(&self.max_queue_depth) {
            return bad("max_queue_depth", self.max_queue_depth as u64, &depths);
        }
        if !QUEUE_DEPTHS.contains(&self.max_aq_depth) {
            return bad("max_aq_depth", self.max_aq_depth as u64, &depths);
        }
        if self.max_io_qpairs_per_ctrlr == 0 {
            return bad("max_io_qpairs_per_ctrlr", 0, "must be at least 1");
        }
        if !self.in_capsule_data_size.is_multiple_of(16) || self.in_capsule_data_size > (1 << 20) {
            return bad(
                "in_capsule_data_size",
                self.in_capsule_data_size as u64,
                "must be a multiple of 16 up to 1 MiB",
            );
        }
        if self.admin_in_capsule_data_size < 8192 || self.admin_in_capsule_data_size > (1 << 20) {
            return bad(
                "admin_in_capsule_data_size",
                self.admin_in_capsule_data_size as u64,
                "must be 8 KiB..=1 MiB (NVMe/TCP admin capsules carry 8 KiB)",
            );
        }
        if !self.max_io_size.is_power_of_two() || !(4096..=(16 << 20)).contains(&self.max_io_size) {
            return bad(
                "max_io_size",
                self.max_io_size as u64,
                "must be a power of two from 4 KiB to 16 MiB",
            );
        }
        if !(4096..=MAX_H2C_DATA).contains(&self.max_h2c_data)
            || !self.max_h2c_data.is_multiple_of(4)
        {
            return bad(
                "max_h2c_data",
                self.max_h2c_data as u64,
                "must be a multiple of 4 from 4096 to 16 MiB",
            );
        }
        if self.send_buffer != 0 && !SEND_BUFFERS.contains(&self.send_buffer) {
            return bad(
                "send_buffer",
                u64::from(self.send_buffer),
                "must be 0 (the kernel's) or 4 KiB..=256 MiB",
            );
        }
        for (option, n) in [
            ("max_connections", self.max_connections),
            ("max_unbound_connections", self.max_unbound_connections),
        ] {
            if !(1..=MAX_CONNECTIONS).contains(&n) {
                return bad(option, n as u64, "must be 1..=1048576");
            }
        }
        for (option, t) in [
            ("icreq_timeout_ms", self.icreq_timeout),
            ("connect_timeout_ms", self.connect_timeout),
            ("auth_timeout_ms", self.auth_timeout),
        ] {
            if t < Duration::from_millis(1) || t > MAX_HANDSHAKE_TIMEOUT {
                return bad(
                    option,
                    t.as_millis().min(u64::MAX as u128) as u64,
                    "must be 1 ms..=1 hour",
                );
            }
        }
        if self.io_unit_size < 4096 || !self.io_unit_size.is_multiple_of(4096) {
            return bad(
                "io_unit_size",
                self.io_unit_size as u64,
                "must be a multiple of 4096",
            );
        }
        if self.pool_bytes() < self.max_io_size as u64 {
            return bad(
                "num_shared_buffers",
                self.num_shared_buffers as u64,
                &format!(
                    "num_shared_buffers x io_unit_size ({} bytes) must hold one max_io_size transfer ({} bytes)",
                    self.pool_bytes(),
                    self.max_io_size
                ),
            );
        }
        if self.pool_bytes() > MAX_POOL_BYTES {
            return bad(
                "num_shared_buffers",
                self.num_shared_buffers as u64,
                "num_shared_buffers x io_unit_size must be at most 1 TiB",
            );
        }
        if let Some(c) = self.buf_cache_size {
            if c > self.num_shared_buffers {
                return bad(
                    "buf_cache_size",
                    c as u64,
                    "must be at most num_shared_buffers",
                );
            }
        }
        if self.data_timeout < Duration::from_millis(1) || self.data_timeout > MAX_HANDSHAKE_TIMEOUT
        {
            return bad(
                "data_timeout_ms",
                self.data_timeout.as_millis().min(u64::MAX as u128) as u64,
                "must be 1 ms..=1 hour",
            );
        }
        if self.busy_poll_us > 1_000_000 {
            return bad(
                "busy_poll_us",
                self.busy_poll_us as u64,
                "must be 0..=1000000 microseconds",
            );
        }
        if !self.uring_rx_buffers.is_power_of_two() || self.uring_rx_buffers > 1 << 15 {
            return bad(
                "uring_rx_buffers",
                self.uring_rx_buffers as u64,
                "must be a power of two, at most 32768",
            );
        }
        if !(512..=1 << 20).contains(&self.uring_rx_buffer_size) {
            return bad(
                "uring_rx_buffer_size",
                self.uring_rx_buffer_size as u64,
                "must be 512..=1048576",
            );
        }
        if self.uring_zcopy_threshold > MAX_ZCOPY_THRESHOLD {
            return bad(
                "uring_zcopy_threshold",
                self.uring_zcopy_threshold as u64,
                "must be 0 (off) ..=1073741824 bytes",
            );
        }
        if self.uring_registered_buffers != 0 {
            if !REGISTERED_BUFFERS.contains(&self.uring_registered_buffers) {
                return bad(
                    "uring_registered_buffers",
                    u64::from(self.uring_registered_buffers),
                    "must be 0 (off) or 1 MiB..=1 GiB",
                );
            }
            if self.uring_zcopy_threshold == 0 {
                return bad(
                    "uring_registered_buffers",
                    u64::from(self.uring_registered_buffers),
                    "only zero-copy sends use them: set uring_zcopy_threshold too",
                );
            }
        }
        if !(1..=MAX_SEND_IOV).contains(&self.send_iov) {
            return bad("send_iov", self.send_iov as u64, "must be 1..=512");
        }
        if !(4096..=MAX_RX_BUFFER).contains(&self.rx_buffer) {
            return bad(
                "rx_buffer_size",
                self.rx_buffer as u64,
                "must be 4096..=16777216 bytes",
            );
        }
        Ok(())
    }
}

/// The socket send buffers `TransportOptions::send_buffer` may ask for
/// (besides 0, the kernel's own).
pub const SEND_BUFFERS: std::ops::RangeInclusive<u32> = 4096..=(256 << 20);
