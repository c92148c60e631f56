//! A minimal HTTP/1.x responder for Prometheus scrapes: `GET /metrics`
//! answers the exposition text, anything else 404 or 405. It runs on a
//! thread of its own, never a runtime thread, and bounds what a peer can
//! make it hold: one connection at a time, a request head of at most
//! [`MAX_HEAD`] bytes read within [`IO_TIMEOUT`], the connection closed
//! after each response.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most bytes of a request line and headers.
pub const MAX_HEAD: usize = 8 << 10;
/// Time a peer has to send its request and take the response.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Renders the exposition text at each scrape.
pub type Render = Box<dyn Fn() -> String + Send>;

/// Why the metrics endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("--metrics {addr}: cannot listen: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--metrics: starting its thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A running endpoint; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (`IP:PORT`; port 0 picks one) and serves `render`.
    pub fn start(addr: &str, render: Render) -> Result<MetricsServer, MetricsError> {
        let listen = |source| MetricsError::Listen {
            addr: addr.to_string(),
            source,
        };
        let l = TcpListener::bind(addr).map_err(listen)?;
        let local = l.local_addr().map_err(listen)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pollux-metrics".into())
            .spawn(move || {
                for conn in l.incoming() {
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(s) => {
                            if let Err(e) = answer(s, &render) {
                                tracing::debug!("metrics scrape: {e}");
                            }
                        }
                        Err(e) => {
                            tracing::warn!("metrics endpoint: accept: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        tracing::info!(%local, "Prometheus metrics at http://{local}/metrics");
        Ok(MetricsServer {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// The address listened on (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The request line of a complete head in `buf`, if the head is complete.
fn request_line(buf: &[u8]) -> Option<&str> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| {
        // Tolerate bare LF line ends.
        buf.windows(2).position(|w| w == b"\n\n")
    })?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    head.lines().next()
}

/// Status line and body for a request line.
fn respond(line: &str, render: &Render) -> (&'static str, &'static str, String) {
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" && path != "/" {
        return ("404 Not Found", "text/plain", "try /metrics\n".into());
    }
    if method != "GET" && method != "HEAD" {
        return ("405 Method Not Allowed", "text/plain", "GET only\n".into());
    }
    (
        "200 OK",
        "text/plain; version=0.0.4; charset=utf-8",
        render(),
    )
}

fn answer(mut s: TcpStream, render: &Render) -> std::io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let line = loop {
        if let Some(l) = request_line(&buf) {
            break l.to_string();
        }
        if buf.len() >= MAX_HEAD {
            let msg = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
            return s.write_all(msg.as_bytes());
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n.min(MAX_HEAD - buf.len().min(MAX_HEAD))]);
    };
    let (status, ctype, body) = respond(&line, render);
    let head_only = line.starts_with("HEAD ");
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    if !head_only {
        s.write_all(body.as_bytes())?;
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let m = MetricsServer::start("127.0.0.1:0", Box::new(|| "pollux_up 1\n".into())).unwrap();
        let a = m.addr();
        let r = get(a, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("version=0.0.4"), "{r}");
        assert!(r.ends_with("\r\n\r\npollux_up 1\n"), "{r}");
        let r = get(a, b"GET /nope HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        let r = get(a, b"POST /metrics HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405"), "{r}");
        // An oversized head is refused; a peer that goes away mid-request
        // harms nothing: the next scrape is answered.
        let big = vec![b'a'; MAX_HEAD];
        let r = get(a, &big);
        assert!(r.starts_with("HTTP/1.1 431"), "{r}");
        drop(TcpStream::connect(a).unwrap());
        let r = get(a, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(r.contains("pollux_up 1"), "{r}");
    }

    #[test]
    fn a_taken_port_is_named() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let e = MetricsServer::start(&addr, Box::new(String::new))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with(&format!("--metrics {addr}: cannot listen")),
            "{e}"
        );
    }
}
