//! The NVMe/TCP transport (NVMe/TCP Transport 1.0): everything that knows
//! TCP or its PDUs is here, and nothing outside does.
//!
//! - `server`: the listeners (bound at start), what the transport's
//!   threads share (`TcpShared`: the connection count, the data buffer
//!   pool, the threads' cores), each thread's connection table, its
//!   pollers, accept and placement, timers (Keep Alive, handshake and
//!   data timeouts, linger), drain at shutdown.
//! - `conn`: one connection, a `Conn`: the core's queue pair
//!   (`qpair::Qpair`) beside `Tcp`, the TCP half (socket, receive buffer
//!   and PDU state, send queue, handshake phase), and its lifecycle.
//! - `rx`: receive: reads, PDU headers checked and parsed, data streamed
//!   to its buffer with its digest; ICReq, command capsules (handed to
//!   the core), H2CData.
//! - `tx`: `QueueTransport` for `Tcp` (response capsules, C2HData, R2T,
//!   close), C2HTermReq, and the flush: one `sendmsg` per poll.
//! - `queue`: the send queue (header bytes copied, data referenced).
//! - `sock`: the socket calls beyond `std::net`, behind the `Wire` trait
//!   (the tests drive connections over memory through it).
//!
//! The NVMe/TCP engine (PDU reassembly, send segments, digests, R2T and
//! H2CData bookkeeping) is `rx`, `tx`, `queue` and `Tcp`'s PDU state: an
//! I/O-free engine shared with the host would replace them, behind the
//! same `QueueTransport`, without the core changing.
pub(crate) mod conn;
pub(crate) mod queue;
mod rx;
pub(crate) mod server;
pub(crate) mod sock;
mod tx;
