//! One client connection: SPDK's framing (JSON values back to back, no
//! delimiter, decoded incrementally), JSON-RPC 2.0 request checks, and the
//! response written back with the request's id.

use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde_json::{json, Value};

use crate::error::{RpcError, INVALID_REQUEST};
use crate::limits::Limits;
use crate::methods::Methods;

/// Bytes read from a socket at a time; requests are decoded after each
/// read, so a connection buffers at most `max_request_bytes` plus this.
const READ_CHUNK: usize = 64 * 1024;

/// A client connection and its buffers.
pub(crate) struct Conn {
    pub(crate) stream: UnixStream,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    out_off: usize,
    /// Since when the connection has had a partial request buffered or a
    /// response not yet taken by the client.
    pending_since: Option<Instant>,
    /// No more requests are read: after a parse error, an oversized request
    /// or the client's end of file. The connection closes once the
    /// responses are sent.
    closing: bool,
}

/// Why a connection was closed (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    /// The client closed its end, or the responses after an error were
    /// sent.
    Done,
    /// The client closed its end with a partial request buffered.
    MidRequest,
    /// A socket error.
    Error,
}

impl Conn {
    pub(crate) fn new(stream: UnixStream) -> Conn {
        Conn {
            stream,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            out_off: 0,
            pending_since: None,
            closing: false,
        }
    }

    /// Whether the connection waits to read requests (it reads only when
    /// every response so far has been taken by the client).
    pub(crate) fn wants_read(&self) -> bool {
        !self.closing && self.out_off == self.outbuf.len()
    }

    /// Whether responses wait to be written.
    pub(crate) fn wants_write(&self) -> bool {
        self.out_off < self.outbuf.len()
    }

    /// Since when a partial request or an unsent response has waited.
    pub(crate) fn pending_since(&self) -> Option<Instant> {
        self.pending_since
    }

    /// Reads what the client sent, answers every complete request, and
    /// tries to send the responses. `Err` when the connection is to be
    /// closed now.
    pub(crate) fn on_readable(
        &mut self,
        methods: &Methods,
        limits: &Limits,
        now: Instant,
    ) -> Result<(), Closed> {
        let mut eof = false;
        while self.wants_read() {
            let old = self.inbuf.len();
            self.inbuf.resize(old + READ_CHUNK, 0);
            match self.stream.read(&mut self.inbuf[old..]) {
                Ok(0) => {
                    self.inbuf.truncate(old);
                    eof = true;
                    break;
                }
                Ok(n) => {
                    self.inbuf.truncate(old + n);
                    self.decode(methods, limits);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.inbuf.truncate(old);
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {
                    self.inbuf.truncate(old);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "RPC connection read failed");
                    return Err(Closed::Error);
                }
            }
        }
        if eof {
            self.closing = true;
            if !self.inbuf.iter().all(u8::is_ascii_whitespace) {
                tracing::debug!(
                    bytes = self.inbuf.len(),
                    "RPC client disconnected mid-request"
                );
                return Err(Closed::MidRequest);
            }
        }
        self.on_writable(now)
    }

    /// Sends what it can of the responses. `Err` when the connection is to
    /// be closed now.
    pub(crate) fn on_writable(&mut self, now: Instant) -> Result<(), Closed> {
        while self.out_off < self.outbuf.len() {
            let rest = &self.outbuf[self.out_off..];
            // SAFETY: `rest` is a live, initialised byte slice of
            // `rest.len()` bytes, and the fd is this connection's open
            // socket. MSG_NOSIGNAL: a peer that closed gets EPIPE, not a
            // SIGPIPE to the process.
            let n = unsafe {
                libc::send(
                    self.stream.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock => break,
                    ErrorKind::Interrupted => continue,
                    _ => {
                        tracing::debug!(error = %e, "RPC connection write failed");
                        return Err(Closed::Error);
                    }
                }
            }
            // `n >= 0` here.
            self.out_off += n.unsigned_abs();
        }
        if self.out_off == self.outbuf.len() {
            self.outbuf.clear();
            self.out_off = 0;
            if self.closing {
                return Err(Closed::Done);
            }
        }
        self.pending_since = if self.wants_write() || !self.inbuf.is_empty() {
            Some(self.pending_since.unwrap_or(now))
        } else {
            None
        };
        Ok(())
    }

    /// Answers every complete request at the front of the input buffer.
    fn decode(&mut self, methods: &Methods, limits: &Limits) {
        loop {
            let start = self
                .inbuf
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(self.inbuf.len());
            self.inbuf.drain(..start);
            if self.inbuf.is_empty() {
                return;
            }
            let mut values = serde_json::Deserializer::from_slice(&self.inbuf).into_iter::<Value>();
            match values.next() {
                None => {
                    self.inbuf.clear();
                    return;
                }
                Some(Ok(v)) => {
                    let len = values.byte_offset();
                    if len > limits.max_request_bytes {
                        self.too_large(limits);
                        return;
                    }
                    self.inbuf.drain(..len);
                    let resp = handle(methods, v);
                    if let Some(resp) = resp {
                        self.respond(&resp);
                    }
                }
                Some(Err(e)) if e.is_eof() => {
                    if self.inbuf.len() > limits.max_request_bytes {
                        self.too_large(limits);
                    }
                    return;
                }
                Some(Err(e)) => {
                    // As SPDK: no resynchronisation point in a stream of
                    // JSON, so answer and close.
                    tracing::debug!(error = %e, "RPC request is not valid JSON");
                    self.error(
                        &Value::Null,
                        &RpcError::parse_error(format!("Parse error: {e}")),
                    );
                    self.inbuf.clear();
                    self.closing = true;
                    return;
                }
            }
        }
    }

    fn too_large(&mut self, limits: &Limits) {
        tracing::warn!(
            limit = limits.max_request_bytes,
            "RPC request larger than the limit; closing the connection"
        );
        self.error(
            &Value::Null,
            &RpcError::new(
                INVALID_REQUEST,
                format!(
                    "Invalid request: larger than {} bytes",
                    limits.max_request_bytes
                ),
            ),
        );
        self.inbuf.clear();
        self.closing = true;
    }

    fn error(&mut self, id: &Value, e: &RpcError) {
        self.respond(&error_response(id, e));
    }

    fn respond(&mut self, resp: &Value) {
        // Writing a `Value` to a Vec cannot fail.
        if serde_json::to_writer(&mut self.outbuf, resp).is_err() {
            tracing::error!("RPC response could not be serialised");
        }
        self.outbuf.push(b'\n');
    }
}

/// `{"jsonrpc":"2.0","id":..,"error":{"code":..,"message":..}}`.
pub(crate) fn error_response(id: &Value, e: &RpcError) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": e.code, "message": e.message },
    })
}

/// Checks one request and runs its method. `None` for a notification's
/// result (no `id`, or `id` null: no response, as SPDK).
pub(crate) fn handle(methods: &Methods, v: Value) -> Option<Value> {
    let mut req = match v {
        Value::Object(o) => o,
        Value::Array(_) => {
            // SPDK does not support batches either.
            return Some(error_response(
                &Value::Null,
                &RpcError::invalid_request("Invalid request: batch requests are not supported"),
            ));
        }
        _ => {
            return Some(error_response(
                &Value::Null,
                &RpcError::invalid_request("Invalid request: not a JSON object"),
            ));
        }
    };
    let id = match req.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => {
            return Some(error_response(
                &Value::Null,
                &RpcError::invalid_request("Invalid request: id must be a string, number or null"),
            ))
        }
    };
    let idv = id.clone().unwrap_or(Value::Null);
    let invalid = |msg: &str| Some(error_response(&idv, &RpcError::invalid_request(msg)));
    match req.remove("jsonrpc") {
        None => {}
        Some(Value::String(s)) if s == "2.0" => {}
        Some(_) => return invalid("Invalid request: jsonrpc must be \"2.0\""),
    }
    let method = match req.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return invalid("Invalid request: method must be a string"),
        None => return invalid("Invalid request: method is missing"),
    };
    let params = match req.remove("params") {
        None | Some(Value::Null) => None,
        Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
        Some(_) => return invalid("Invalid request: params must be an object or an array"),
    };
    if let Some(k) = req.keys().next() {
        return invalid(&format!("Invalid request: unknown member {k:?}"));
    }
    let started = Instant::now();
    let result = methods.call(&method, params.as_ref());
    tracing::debug!(
        method,
        ok = result.is_ok(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "RPC"
    );
    match result {
        Ok(r) => match id {
            Some(id) if !id.is_null() => Some(json!({ "jsonrpc": "2.0", "id": id, "result": r })),
            // A notification: SPDK sends no result.
            _ => None,
        },
        // As SPDK: errors are answered even to notifications (id null).
        Err(e) => Some(error_response(&idv, &e)),
    }
}
