//! The NVMe/TCP transport (NVMe/TCP Transport 1.0): everything that knows
//! TCP or its PDUs is here, and nothing outside does.
//!
//! - `server`: the listeners (bound at start or live), what the transport's
//!   threads share (`TcpShared`: the connection count, the data buffer
//!   pool, the threads' cores), each thread's connection table, its
//!   pollers, accept and placement, timers (Keep Alive, handshake and
//!   data timeouts, linger), drain at shutdown.
//! - `conn`: one connection, a `Conn`: the core's queue pair
//!   (`qpair::Qpair`) beside `Tcp`, the TCP half (socket, receive buffer
//!   and PDU state, send queue, handshake phase), and its lifecycle.
//! - `rx`: receive: reads (large data straight into its buffer), the
//!   bytes handed to the engine, and what its events mean here: ICReq,
//!   command capsules (a slot and a buffer, then the core), H2CData, data
//!   put where it belongs.
//! - `tx`: `QueueTransport` for `Tcp` (response capsules, C2HData, R2T,
//!   close) queued in the engine, C2HTermReq, and the flush: one
//!   `sendmsg` per poll.
//! - `sock`: the socket calls beyond `std::net`, behind the `Wire` trait
//!   (the tests drive connections over memory through it), and the
//!   `posix` wire, whose receives the thread's epoll may gate.
//!
//! The NVMe/TCP protocol itself (PDU reassembly and checks, send
//! segments, digests, R2T and H2CData bookkeeping, ICReq/ICResp) is the
//! I/O-free engine the host transport runs on too,
//! `pollux_tcp::engine::target::TargetQueue`, which `Tcp` holds. What is
//! here is socket I/O, the glue to the core's `Qpair`, and target policy
//! (slots and buffers for capsules, data and handshake timeouts,
//! backpressure, closing).
pub(crate) mod conn;
mod rx;
pub(crate) mod server;
pub(crate) mod sock;
mod sockimpl;
mod tx;
pub(crate) mod uring;
