//! The NVMe/TCP connection engine, I/O-free, for both ends.
//!
//! Split as rustls splits its codec and connection core from its client
//! and server: the wire formats are `pollux_spec::tcp` (PDU headers,
//! checks, builders, digests); this engine is pure state machines fed
//! received bytes and returning events and send segments; the socket
//! belongs to whoever drives it.
//!
//! - `rx`: PDU reassembly from a byte stream however it is split: header
//!   checks (type, flags, lengths, limits, header digest), padding, data
//!   handed out in pieces with its data digest computed on the way.
//! - `tx`: the send queue: PDU headers and small data copied, command
//!   data referenced where it lies (`memory`), marks; iovecs for one
//!   vectored send.
//! - `ic`: ICReq/ICResp negotiation, both ends.
//! - `host`: the host end of a queue: capsules out, C2HData, R2T →
//!   H2CData and completions in (pollux's host transport, `crate::conn`).
//! - `target`: the controller end: ICReq answered, capsules and H2CData
//!   in (checked against the transfer each R2T asked for), R2T,
//!   C2HData, response capsules and Termination Requests out.
pub mod host;
pub mod ic;
pub mod memory;
pub mod rx;
pub mod target;
pub mod tx;

#[cfg(test)]
mod tests;
