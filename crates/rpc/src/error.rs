//! The errors of a JSON-RPC method ([`RpcError`], sent to the client) and
//! of starting the server ([`ServeError`]).

use std::path::PathBuf;

/// JSON-RPC 2.0's "Parse error": the request is not valid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0's "Invalid Request": valid JSON but not a request object.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0's "Method not found".
pub const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC 2.0's "Invalid params".
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC 2.0's "Internal error".
pub const INTERNAL_ERROR: i32 = -32603;

/// An error answered to a JSON-RPC request: `{"code": .., "message": ..}`
/// in the response's `error` member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    /// JSON-RPC error code: one of the -327xx codes, or `-errno` as SPDK's
    /// method handlers answer.
    pub code: i32,
    /// Human-readable message; for bad parameters it names the parameter.
    pub message: String,
}

impl RpcError {
    /// An error with any code.
    pub fn new(code: i32, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// -32602: a parameter is missing, unknown or of the wrong type; the
    /// message names the parameter.
    pub fn invalid_params(msg: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, msg)
    }

    /// -32601 "Method not found", as SPDK answers (SPDK's message does not
    /// name the method; the log line does).
    pub fn method_not_found(method: &str) -> RpcError {
        tracing::debug!(method, "RPC method not found");
        RpcError::new(METHOD_NOT_FOUND, "Method not found")
    }

    /// -32600: the request is not a valid JSON-RPC 2.0 request object.
    pub fn invalid_request(msg: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_REQUEST, msg)
    }

    /// -32700: the request is not valid JSON.
    pub fn parse_error(msg: impl Into<String>) -> RpcError {
        RpcError::new(PARSE_ERROR, msg)
    }

    /// -32603: the method failed for a reason that is not the caller's.
    pub fn internal(msg: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, msg)
    }

    /// SPDK's handlers' style: `code = -errno` (ENODEV -> -19, EEXIST ->
    /// -17, EINVAL -> -22, ...). `errno` may be given positive or negative.
    pub fn errno(errno: i32, msg: impl Into<String>) -> RpcError {
        RpcError::new(-errno.saturating_abs(), msg)
    }
}

/// Why [`crate::Server::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A live server answers on the path.
    #[error(
        "RPC socket {} is in use by another process (another target running? give -r PATH)",
        path.display()
    )]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket; it is left alone.
    #[error(
        "RPC socket path {} exists and is not a socket; refusing to replace it (remove it or give -r PATH)",
        path.display()
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The path does not fit in a `sockaddr_un` (107 bytes on Linux).
    #[error("RPC socket path {} is too long ({len} bytes, at most {max})", path.display())]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The most a `sockaddr_un` holds.
        max: usize,
    },
    /// A system call on the socket failed.
    #[error("RPC socket {}: {what}: {source}", path.display())]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
