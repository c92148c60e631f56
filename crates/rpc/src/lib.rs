//! A JSON-RPC 2.0 server on a Unix socket that speaks SPDK's framing, so
//! that SPDK's own client (`spdk-rpc`, `rpc.py`) drives pollux's apps
//! unchanged.
//!
//! # Framing
//!
//! As SPDK's `lib/jsonrpc`: a client writes JSON request objects back to
//! back (no delimiter; SPDK's client separates them with a newline) and
//! the server decodes them incrementally. Each response is one JSON object
//! followed by `\n`. Requests on one connection are answered in order.
//!
//! - A request must be an object with `method` (a string); `jsonrpc`, if
//!   present, must be `"2.0"`; `params`, if present, an object, an array
//!   or null; `id` a string, a number or null. Other members are refused.
//!   Anything else is -32600 "Invalid request".
//! - A request without `id` (or with `id` null) is a notification: its
//!   result is not sent. Its error is, with `id` null (as SPDK).
//! - A batch (a top-level array) is -32600, as SPDK does not support
//!   batches either.
//! - Invalid JSON is -32700 and closes the connection (there is no point
//!   to resynchronise at in a stream of JSON values).
//!
//! # Limits
//!
//! See [`Limits`]: a request larger than `max_request_bytes` is answered
//! with -32600 and its connection closed; connections past
//! `max_connections` are answered with -32603 and closed; a connection
//! that holds a partial request for `request_timeout` is closed. A client
//! disconnecting mid-request only closes its connection.
//!
//! # Threads
//!
//! One server thread accepts the connections and runs the handlers, one
//! request at a time (as SPDK runs its RPCs on one thread). It is never a
//! runtime/reactor thread: a handler that needs one sends it work (e.g.
//! `RuntimeHandle::call`).

mod conn;
mod error;
mod limits;
mod methods;
mod server;

pub use error::{
    RpcError, ServeError, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
    PARSE_ERROR,
};
pub use limits::Limits;
pub use methods::{no_params, params, Methods};
pub use server::Server;
