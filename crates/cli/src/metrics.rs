//! `--metrics ADDR`: the counters of `bdev_get_iostat` and
//! `thread_get_stats` (and the target's connections, controllers and
//! buffer bytes) in Prometheus' text format, on `http://ADDR/metrics`.
//!
//! The format is a few lines of text (`name{label="v"} value`), written by
//! hand; the server is one thread answering one GET at a time.
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use clap::Args;

use crate::rpc::App;

#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Serve counters in Prometheus' text format on http://ADDR/metrics
    /// (IP:port; port 0 picks one, printed at start).
    #[arg(long = "metrics", value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

/// More samples, taken at each scrape.
pub type Extra = Box<dyn Fn() -> Vec<Sample> + Send + Sync>;

/// One sample of a metric.
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    /// "counter" or "gauge".
    pub kind: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// A label value, escaped as the text format wants.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn sample(
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    labels: Vec<(&'static str, String)>,
    value: f64,
) -> Sample {
    Sample {
        name,
        help,
        kind,
        labels,
        value,
    }
}

/// The samples of the app's bdevs and threads, then `extra`'s.
fn samples(app: &App, extra: Option<&Extra>) -> Vec<Sample> {
    let mut v = Vec::new();
    const C: &str = "counter";
    for (name, b) in app.registry.list() {
        let st = b.stats();
        let l = || vec![("bdev", name.clone())];
        v.extend([
            sample(
                "pollux_bdev_read_ops_total",
                "Read requests (bdev_get_iostat num_read_ops).",
                C,
                l(),
                st.reads as f64,
            ),
            sample(
                "pollux_bdev_read_bytes_total",
                "Bytes read (bdev_get_iostat bytes_read).",
                C,
                l(),
                st.read_bytes as f64,
            ),
            sample(
                "pollux_bdev_write_ops_total",
                "Write requests (bdev_get_iostat num_write_ops).",
                C,
                l(),
                st.writes as f64,
            ),
            sample(
                "pollux_bdev_written_bytes_total",
                "Bytes written (bdev_get_iostat bytes_written).",
                C,
                l(),
                st.write_bytes as f64,
            ),
            sample(
                "pollux_bdev_other_ops_total",
                "Flush, write zeroes, unmap, reset and passthrough requests.",
                C,
                l(),
                st.others as f64,
            ),
            sample(
                "pollux_bdev_io_errors_total",
                "Requests completed with an error.",
                C,
                l(),
                st.errors as f64,
            ),
        ]);
    }
    if let Some(rt) = app.runtime.get() {
        if let Ok(threads) = rt.runtime().stats() {
            for t in threads {
                let l = || {
                    vec![
                        ("thread", format!("reactor_{}", t.core)),
                        ("core", t.core.to_string()),
                    ]
                };
                v.extend([
                    sample(
                        "pollux_thread_busy_seconds_total",
                        "Time a runtime thread did work (thread_get_stats busy).",
                        C,
                        l(),
                        t.busy.as_secs_f64(),
                    ),
                    sample(
                        "pollux_thread_idle_seconds_total",
                        "Time a runtime thread polled without work or slept (thread_get_stats idle).",
                        C,
                        l(),
                        (t.idle + t.asleep).as_secs_f64(),
                    ),
                    sample(
                        "pollux_thread_asleep_seconds_total",
                        "Time a runtime thread slept in epoll.",
                        C,
                        l(),
                        t.asleep.as_secs_f64(),
                    ),
                    sample(
                        "pollux_thread_loops_total",
                        "Iterations of a runtime thread's loop.",
                        C,
                        l(),
                        t.loops as f64,
                    ),
                    sample(
                        "pollux_thread_pollers",
                        "Pollers on a runtime thread (thread_get_stats active_pollers_count).",
                        "gauge",
                        l(),
                        t.pollers.len() as f64,
                    ),
                ]);
            }
        }
    }
    if let Some(f) = extra {
        v.extend(f());
    }
    v
}

/// The text format of `samples`: each metric's samples together, under
/// its HELP and TYPE lines.
pub fn render(samples: &[Sample]) -> String {
    let mut out = String::new();
    let mut names: Vec<&str> = Vec::new();
    for s in samples {
        if !names.contains(&s.name) {
            names.push(s.name);
        }
    }
    for n in names {
        let mut first = true;
        for s in samples.iter().filter(|s| s.name == n) {
            if first {
                first = false;
                let _ = writeln!(out, "# HELP {} {}", s.name, s.help);
                let _ = writeln!(out, "# TYPE {} {}", s.name, s.kind);
            }
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            if labels.is_empty() {
                let _ = writeln!(out, "{} {}", s.name, s.value);
            } else {
                let _ = writeln!(out, "{}{{{}}} {}", s.name, labels.join(","), s.value);
            }
        }
    }
    out
}

/// A running metrics server; dropping it stops it.
pub struct Metrics {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Metrics {
    /// Listens on `addr` and serves the app's counters (and `extra`'s).
    pub fn start(addr: SocketAddr, app: App, extra: Option<Extra>) -> std::io::Result<Metrics> {
        let l = TcpListener::bind(addr)?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for s in l.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(s) = s {
                        if let Err(e) = answer(s, &app, extra.as_ref()) {
                            tracing::debug!(error = %e, "metrics request");
                        }
                    }
                }
            })?;
        Ok(Metrics {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one HTTP request: GET /metrics (or /) gets the text format,
/// anything else 404.
fn answer(mut s: TcpStream, app: &App, extra: Option<&Extra>) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let mut parts = text.lines().next().unwrap_or_default().split_whitespace();
    let (status, ctype, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics" | "/")) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(&samples(app, extra)),
        ),
        _ => ("404 Not Found", "text/plain", "GET /metrics\n".to_string()),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_groups_samples_under_one_help_and_type() {
        let s = |bdev: &str, v| {
            sample(
                "pollux_bdev_read_ops_total",
                "Reads.",
                "counter",
                vec![("bdev", bdev.to_string())],
                v,
            )
        };
        let g = sample(
            "pollux_target_connections",
            "Connections.",
            "gauge",
            vec![],
            2.0,
        );
        let text = render(&[s("a", 1.0), g, s("b\"\\", 2.5)]);
        assert_eq!(
            text,
            "# HELP pollux_bdev_read_ops_total Reads.\n\
             # TYPE pollux_bdev_read_ops_total counter\n\
             pollux_bdev_read_ops_total{bdev=\"a\"} 1\n\
             pollux_bdev_read_ops_total{bdev=\"b\\\"\\\\\"} 2.5\n\
             # HELP pollux_target_connections Connections.\n\
             # TYPE pollux_target_connections gauge\n\
             pollux_target_connections 2\n"
        );
    }
}
