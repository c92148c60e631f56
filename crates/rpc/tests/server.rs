//! The server over a real Unix socket: framing, JSON-RPC checks, limits,
//! and the socket file's life.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pollux_rpc::{params, Limits, Methods, RpcError, ServeError, Server};
use serde_json::{json, Value};

/// A fresh socket path in a fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "pollux-rpc-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn sock(&self) -> PathBuf {
        self.0.join("rpc.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NullParams {
    name: String,
    num_blocks: u64,
    #[serde(default = "default_bs")]
    block_size: u32,
}

fn default_bs() -> u32 {
    512
}

fn methods() -> Methods {
    let mut m = Methods::new();
    m.add("echo", |p| Ok(p.cloned().unwrap_or(Value::Null)));
    m.add("create", |p| {
        let p: NullParams = params(p)?;
        Ok(json!({"name": p.name, "bytes": p.num_blocks * u64::from(p.block_size)}))
    });
    m.add("fail", |_| {
        Err(RpcError::errno(libc_enodev(), "no such device"))
    });
    m.add("slow", |_| {
        std::thread::sleep(Duration::from_millis(200));
        Ok(Value::Bool(true))
    });
    m
}

fn libc_enodev() -> i32 {
    19
}

fn start(limits: Limits) -> (TempDir, Server) {
    let d = TempDir::new();
    let s = Server::start(&d.sock(), methods(), limits).unwrap();
    (d, s)
}

/// A client as SPDK's: writes requests, reads responses by incremental
/// JSON decoding.
struct Client {
    s: UnixStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(d: &TempDir) -> Client {
        let s = UnixStream::connect(d.sock()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { s, buf: Vec::new() }
    }
    fn send_raw(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }
    /// The next response, or None at end of file.
    fn recv(&mut self) -> Option<Value> {
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let n = it.byte_offset();
                    assert_eq!(
                        self.buf.get(n),
                        Some(&b'\n'),
                        "a response ends with a newline"
                    );
                    self.buf.drain(..=n);
                    return Some(v);
                }
                Some(Err(e)) if !e.is_eof() => panic!("bad response: {e}"),
                _ => {}
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }
    fn call(&mut self, id: u64, method: &str, params: Option<Value>) -> Value {
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
        if let Some(p) = params {
            req["params"] = p;
        }
        self.send_raw(serde_json::to_string_pretty(&req).unwrap().as_bytes());
        let r = self.recv().expect("a response");
        assert_eq!(r["jsonrpc"], "2.0");
        assert_eq!(r["id"], id);
        r
    }
}

#[test]
fn builtins_answer_in_spdk_shapes() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    let v = c.call(1, "spdk_get_version", None);
    assert!(v["result"]["version"]
        .as_str()
        .unwrap()
        .starts_with("pollux v"));
    assert!(v["result"]["fields"]["major"].is_u64());
    let m = c.call(2, "rpc_get_methods", None);
    let names: Vec<&str> = m["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for n in [
        "spdk_get_version",
        "rpc_get_methods",
        "framework_wait_init",
        "echo",
        "create",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    assert_eq!(c.call(3, "framework_wait_init", None)["result"], true);
    let e = c.call(4, "spdk_get_version", Some(json!({"x": 1})));
    assert_eq!(e["error"]["code"], -32602);
    let e = c.call(5, "rpc_get_methods", Some(json!({"current": "yes"})));
    assert_eq!(e["error"]["code"], -32602);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("current"),
        "{e}"
    );
}

#[test]
fn requests_in_sequence_and_back_to_back_on_one_connection() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    for i in 0..20 {
        let r = c.call(i, "echo", Some(json!({"i": i})));
        assert_eq!(r["result"]["i"], i);
    }
    // Back to back, no delimiter, split at odd places.
    let mut all = String::new();
    for i in 100..110 {
        all += &json!({"jsonrpc": "2.0", "method": "echo", "id": i, "params": [i]}).to_string();
    }
    for chunk in all.as_bytes().chunks(7) {
        c.send_raw(chunk);
    }
    for i in 100..110 {
        let r = c.recv().unwrap();
        assert_eq!(r["id"], i);
        assert_eq!(r["result"], json!([i]));
    }
    // A string id is echoed as is.
    c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","id":"abc"}"#);
    assert_eq!(c.recv().unwrap()["id"], "abc");
}

#[test]
fn errors_have_spdk_codes_and_name_the_parameter() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    let e = c.call(1, "no_such_method", None);
    assert_eq!(e["error"]["code"], -32601);
    assert_eq!(e["error"]["message"], "Method not found");
    let e = c.call(2, "create", Some(json!({"name": "n"})));
    assert_eq!(e["error"]["code"], -32602);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("num_blocks"),
        "{e}"
    );
    let e = c.call(
        3,
        "create",
        Some(json!({"name": "n", "num_blocks": 1, "block_size": "x"})),
    );
    assert_eq!(e["error"]["code"], -32602);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("block_size"),
        "{e}"
    );
    let e = c.call(
        4,
        "create",
        Some(json!({"name": "n", "num_blocks": 1, "colour": 1})),
    );
    assert_eq!(e["error"]["code"], -32602);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("colour"),
        "{e}"
    );
    let ok = c.call(5, "create", Some(json!({"name": "n", "num_blocks": 2})));
    assert_eq!(ok["result"]["bytes"], 1024);
    let e = c.call(6, "fail", None);
    assert_eq!(e["error"]["code"], -19);
    assert_eq!(e["error"]["message"], "no such device");
}

#[test]
fn invalid_requests_get_32600_and_the_connection_stays() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    for (req, id) in [
        (r#"[{"jsonrpc":"2.0","method":"echo","id":1}]"#, Value::Null),
        (r#"{"jsonrpc":"1.0","method":"echo","id":2}"#, json!(2)),
        (r#"{"jsonrpc":"2.0","method":7,"id":3}"#, json!(3)),
        (r#"{"jsonrpc":"2.0","id":4}"#, json!(4)),
        (
            r#"{"jsonrpc":"2.0","method":"echo","params":"x","id":5}"#,
            json!(5),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"echo","id":{"a":1}}"#,
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","method":"echo","id":7,"extra":1}"#,
            json!(7),
        ),
        ("42", Value::Null),
    ] {
        c.send_raw(req.as_bytes());
        let r = c.recv().unwrap();
        assert_eq!(r["error"]["code"], -32600, "{req}: {r}");
        assert_eq!(r["id"], id, "{req}: {r}");
    }
    assert_eq!(c.call(9, "echo", Some(json!([1])))["result"], json!([1]));
}

#[test]
fn notifications_get_no_result_but_errors() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","params":[1]}"#);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","params":[2],"id":null}"#);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"nope"}"#);
    let e = c.recv().unwrap();
    assert_eq!(e["error"]["code"], -32601);
    assert_eq!(e["id"], Value::Null);
    assert_eq!(c.call(5, "echo", Some(json!([5])))["result"], json!([5]));
}

#[test]
fn malformed_json_gets_32700_and_closes_the_connection() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    assert_eq!(c.call(1, "echo", None)["result"], Value::Null);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","id":2}{"jsonrpc" 2}"#);
    assert_eq!(
        c.recv().unwrap()["id"],
        2,
        "the good request before is answered"
    );
    let e = c.recv().unwrap();
    assert_eq!(e["error"]["code"], -32700);
    assert!(c.recv().is_none(), "closed after a parse error");
    let mut c2 = Client::connect(&d);
    assert_eq!(c2.call(3, "echo", Some(json!([3])))["result"], json!([3]));
}

#[test]
fn a_request_larger_than_the_limit_is_refused_and_the_connection_closed() {
    let limits = Limits {
        max_request_bytes: 4096,
        ..Limits::default()
    };
    let (d, _s) = start(limits);
    // An incomplete request growing past the limit.
    let mut c = Client::connect(&d);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","id":1,"params":[""#);
    let _ = c.s.write_all(&vec![b'a'; 100_000]);
    let e = c.recv().unwrap();
    assert_eq!(e["error"]["code"], -32600);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("4096"),
        "{e}"
    );
    assert!(c.recv().is_none());
    // A complete request past the limit in one write.
    let mut c = Client::connect(&d);
    let big = json!({"jsonrpc":"2.0","method":"echo","id":1,"params":["b".repeat(5000)]});
    c.send_raw(big.to_string().as_bytes());
    assert_eq!(c.recv().unwrap()["error"]["code"], -32600);
    // Just under it works.
    let mut c = Client::connect(&d);
    let ok = c.call(2, "echo", Some(json!(["c".repeat(3900)])));
    assert_eq!(ok["result"][0].as_str().unwrap().len(), 3900);
}

#[test]
fn connections_past_the_limit_are_refused_until_one_closes() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let (d, _s) = start(limits);
    let mut a = Client::connect(&d);
    let mut b = Client::connect(&d);
    assert_eq!(a.call(1, "echo", None)["id"], 1);
    assert_eq!(b.call(1, "echo", None)["id"], 1);
    let mut c = Client::connect(&d);
    let e = c.recv().unwrap();
    assert_eq!(e["error"]["code"], -32603);
    assert!(e["error"]["message"].as_str().unwrap().contains("Too many"));
    assert!(c.recv().is_none());
    drop(a);
    // The server notices the close on its next poll.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = Client::connect(&d);
        c.send_raw(br#"{"jsonrpc":"2.0","method":"echo","id":9}"#);
        let r = c.recv().unwrap();
        if r["id"] == 9 && r.get("result").is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "a slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.call(2, "echo", None)["id"], 2);
}

#[test]
fn a_partial_request_times_out_and_a_disconnect_mid_request_harms_nothing() {
    let limits = Limits {
        request_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (d, _s) = start(limits);
    let mut idle = Client::connect(&d);
    let mut slow = Client::connect(&d);
    slow.send_raw(br#"{"jsonrpc":"2.0","method":"#);
    {
        let mut gone = Client::connect(&d);
        gone.send_raw(br#"{"jsonrpc":"2.0","method":"echo","id":1,"par"#);
    }
    let t = Instant::now();
    assert!(
        slow.recv().is_none(),
        "the partial request's connection is closed"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // A connection with nothing pending is not timed out.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(idle.call(1, "echo", None)["id"], 1);
    let mut c = Client::connect(&d);
    assert_eq!(c.call(2, "echo", Some(json!([2])))["result"], json!([2]));
}

#[test]
fn a_client_that_half_closes_still_gets_its_answer() {
    let (d, _s) = start(Limits::default());
    let mut c = Client::connect(&d);
    c.send_raw(br#"{"jsonrpc":"2.0","method":"slow","id":1}"#);
    c.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(c.recv().unwrap()["result"], true);
    assert!(c.recv().is_none());
}

#[test]
fn the_socket_is_owner_only_whatever_the_umask() {
    // SAFETY: umask(2) has no memory effects; the old mask is restored.
    let old = unsafe { libc_umask(0) };
    let r = std::panic::catch_unwind(|| {
        let (d, _s) = start(Limits::default());
        let m = std::fs::metadata(d.sock()).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    });
    // SAFETY: as above.
    unsafe { libc_umask(old) };
    r.unwrap();
}

extern "C" {
    #[link_name = "umask"]
    fn libc_umask(mask: u32) -> u32;
}

#[test]
fn a_live_socket_is_refused_with_a_clear_error_and_keeps_serving() {
    let (d, _s) = start(Limits::default());
    let e = Server::start(&d.sock(), methods(), Limits::default()).unwrap_err();
    assert!(matches!(e, ServeError::InUse { .. }), "{e:?}");
    assert!(matches!(
        Server::check(&d.sock()),
        Err(ServeError::InUse { .. })
    ));
    let msg = e.to_string();
    assert_eq!(
        msg,
        format!(
            "RPC socket {} is in use by another process (another target running? give -r PATH)",
            d.sock().display()
        )
    );
    let mut c = Client::connect(&d);
    assert_eq!(c.call(1, "echo", None)["id"], 1);
}

#[test]
fn a_stale_socket_is_replaced_and_a_file_is_refused() {
    let d = TempDir::new();
    assert!(Server::check(&d.sock()).is_ok(), "nothing there");
    drop(UnixListener::bind(d.sock()).unwrap());
    assert!(d.sock().exists(), "a stale socket file");
    assert!(Server::check(&d.sock()).is_ok(), "a stale socket");
    assert!(d.sock().exists(), "check changes nothing");
    let s = Server::start(&d.sock(), methods(), Limits::default()).unwrap();
    assert_eq!(Client::connect(&d).call(1, "echo", None)["id"], 1);
    drop(s);
    assert!(!d.sock().exists(), "drop removes the socket file");

    std::fs::write(d.sock(), b"precious").unwrap();
    let e = Server::start(&d.sock(), methods(), Limits::default()).unwrap_err();
    assert!(matches!(e, ServeError::NotASocket { .. }), "{e:?}");
    assert!(Server::check(&d.sock()).is_err());
    assert!(e.to_string().contains(&d.sock().display().to_string()));
    assert_eq!(std::fs::read(d.sock()).unwrap(), b"precious");
}

#[test]
fn drop_stops_the_server() {
    let (d, s) = start(Limits::default());
    let mut c = Client::connect(&d);
    assert_eq!(c.call(1, "echo", None)["id"], 1);
    drop(s);
    assert!(c.recv().is_none(), "connections are closed");
    assert!(UnixStream::connect(d.sock()).is_err());
}
