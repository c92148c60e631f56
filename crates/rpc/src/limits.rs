//! The limits a server keeps its clients to.

use std::time::Duration;

/// Limits protecting the server from its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A request larger than this is answered with -32600 and its
    /// connection closed.
    pub max_request_bytes: usize,
    /// Connections past this many are answered with -32603 and closed.
    pub max_connections: usize,
    /// A connection that holds a partial request, or does not take its
    /// responses, for this long is closed.
    pub request_timeout: Duration,
}

impl Default for Limits {
    /// 1 MiB requests, 64 connections (SPDK's `SPDK_JSONRPC_MAX_CONNS`),
    /// 30 s to complete a request.
    fn default() -> Self {
        Limits {
            max_request_bytes: 1 << 20,
            max_connections: 64,
            request_timeout: Duration::from_secs(30),
        }
    }
}
