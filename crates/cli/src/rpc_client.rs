//! `pollux rpc`: a small JSON-RPC client for a running `pollux target` or
//! `pollux bdevperf` (or SPDK's apps), for machines without Python and
//! SPDK's `spdk-rpc`: `pollux rpc -s SOCK METHOD ['{"param": ...}']`.
//!
//! It sends one JSON-RPC 2.0 request as SPDK's client does (one JSON
//! object, no delimiter), reads one response by incremental decoding,
//! prints the result as JSON on stdout, and exits 1 with the server's
//! error code and message on stderr when the call failed.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

/// Most bytes of a response read (a `save_config` of a large target is
/// well under this).
const MAX_RESPONSE: usize = 64 << 20;

#[derive(Args, Debug)]
pub struct RpcArgs {
    /// The server's Unix socket.
    #[arg(short = 's', long = "server", default_value = "/var/tmp/pollux.sock")]
    pub socket: PathBuf,
    /// Seconds to wait for the response.
    #[arg(short = 't', long = "timeout", default_value_t = 60.0)]
    pub timeout: f64,
    /// The method (`rpc_get_methods` lists them).
    pub method: String,
    /// Its parameters: one JSON object, e.g. '{"name": "Null0", "num_blocks": 131072, "block_size": 512}'.
    pub params: Option<String>,
}

/// Why a call did not return a result.
#[derive(Debug, thiserror::Error)]
pub enum RpcClientError {
    #[error("parameters {given:?}: not a JSON object ({why})")]
    Params { given: String, why: String },
    #[error("-t {0}: must be a number of seconds above 0 and at most 86400")]
    Timeout(f64),
    #[error("cannot connect to {path}: {source} (is a pollux target or bdevperf running with -r {path}?)")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the server closed the connection before a full response")]
    Closed { path: String },
    #[error("{path}: the response is not JSON: {why}")]
    BadResponse { path: String, why: String },
    #[error("{path}: the response exceeds {MAX_RESPONSE} bytes")]
    TooLarge { path: String },
    #[error("{method}: {message} (JSON-RPC error {code})")]
    Server {
        method: String,
        code: i64,
        message: String,
    },
}

/// The request object for `method` with `params` (a JSON object text).
fn request(method: &str, params: Option<&str>) -> Result<Value, RpcClientError> {
    let mut req = json!({"jsonrpc": "2.0", "method": method, "id": 1});
    if let Some(p) = params {
        let bad = |why: String| RpcClientError::Params {
            given: p.to_string(),
            why,
        };
        let v: Value = serde_json::from_str(p).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad("give an object, {\"name\": value, ...}".into()));
        }
        req["params"] = v;
    }
    Ok(req)
}

/// One complete JSON value at the start of `buf`, if there is one yet.
fn complete(buf: &[u8]) -> Result<Option<Value>, String> {
    let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<Value>();
    match it.next() {
        None => Ok(None),
        Some(Ok(v)) => Ok(Some(v)),
        Some(Err(e)) if e.is_eof() => Ok(None),
        Some(Err(e)) => Err(e.to_string()),
    }
}

/// The result of a response, or the server's error.
fn outcome(method: &str, resp: Value) -> Result<Value, RpcClientError> {
    if let Some(e) = resp.get("error") {
        return Err(RpcClientError::Server {
            method: method.to_string(),
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .to_string(),
        });
    }
    Ok(resp.get("result").cloned().unwrap_or(Value::Null))
}

/// Calls `method` on the server at `a.socket` and returns its result.
pub fn call(a: &RpcArgs) -> Result<Value, RpcClientError> {
    if !(a.timeout > 0.0 && a.timeout <= 86400.0) {
        return Err(RpcClientError::Timeout(a.timeout));
    }
    let req = request(&a.method, a.params.as_deref())?;
    let path = a.socket.display().to_string();
    let io = |source| RpcClientError::Io {
        path: path.clone(),
        source,
    };
    let mut s = UnixStream::connect(&a.socket).map_err(|source| RpcClientError::Connect {
        path: path.clone(),
        source,
    })?;
    let t = Some(Duration::from_secs_f64(a.timeout));
    s.set_read_timeout(t).map_err(io)?;
    s.set_write_timeout(t).map_err(io)?;
    s.write_all(req.to_string().as_bytes()).map_err(io)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let n = s.read(&mut chunk).map_err(io)?;
        if n == 0 {
            return Err(RpcClientError::Closed { path });
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(RpcClientError::TooLarge { path });
        }
        match complete(&buf) {
            Ok(Some(v)) => return outcome(&a.method, v),
            Ok(None) => continue,
            Err(why) => return Err(RpcClientError::BadResponse { path, why }),
        }
    }
}

/// `pollux rpc`: prints the result; the exit status is 0 on success.
pub fn main(a: RpcArgs) -> i32 {
    match call(&a) {
        Ok(v) => {
            match serde_json::to_string_pretty(&v) {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("pollux rpc: {e}");
                    return 2;
                }
            }
            0
        }
        Err(e @ RpcClientError::Server { .. }) => {
            eprintln!("pollux rpc: {e}");
            1
        }
        Err(e) => {
            eprintln!("pollux rpc: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_takes_an_object_only() {
        let r = request("bdev_get_bdevs", None).unwrap();
        assert_eq!(r["method"], "bdev_get_bdevs");
        assert_eq!(r["jsonrpc"], "2.0");
        assert!(r.get("params").is_none());
        let r = request("bdev_null_create", Some(r#"{"name":"N","num_blocks":8}"#)).unwrap();
        assert_eq!(r["params"]["num_blocks"], 8);
        let e = request("x", Some("[1]")).unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
        let e = request("x", Some("{nope")).unwrap_err().to_string();
        assert!(e.contains("{nope"), "{e}");
    }

    #[test]
    fn a_response_is_complete_only_when_its_json_is() {
        assert_eq!(complete(b"").unwrap(), None);
        assert_eq!(complete(br#"{"jsonrpc":"2.0","res"#).unwrap(), None);
        let v = complete(br#"{"jsonrpc":"2.0","result":true,"id":1}"#)
            .unwrap()
            .unwrap();
        assert_eq!(v["result"], true);
        assert!(complete(b"}garbage").is_err());
    }

    #[test]
    fn an_error_response_names_code_and_message() {
        let e = outcome(
            "bdev_null_delete",
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-19,"message":"No such device"}}),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "bdev_null_delete: No such device (JSON-RPC error -19)");
        assert_eq!(
            outcome("x", json!({"jsonrpc":"2.0","id":1,"result":[1]})).unwrap(),
            json!([1])
        );
    }
}
