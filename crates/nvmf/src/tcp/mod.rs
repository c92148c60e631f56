//! The NVMe/TCP transport.
pub(crate) mod conn;
pub(crate) mod queue;
mod rx;
pub(crate) mod server;
pub(crate) mod sock;
mod tx;
