//! `--metrics ADDR`: the counters of a running target or bdevperf in
//! Prometheus' text format over HTTP (`http.rs`), rendered at each scrape
//! from the same snapshots `thread_get_stats` and `bdev_get_iostat`
//! answer over JSON-RPC.
mod http;
mod text;

pub use http::{MetricsError, MetricsServer, Render};
use pollux_bdev::BdevStats;
use pollux_runtime::ThreadStats;
pub use text::{Exposition, Kind};

/// The runtime threads' counters (SPDK's `thread_get_stats`).
pub fn threads(e: &mut Exposition, stats: &[ThreadStats]) {
    type Get = fn(&ThreadStats) -> f64;
    let fams: [(&str, Kind, &str, Get); 6] = [
        (
            "pollux_thread_busy_seconds_total",
            Kind::Counter,
            "Time a runtime thread spent in loop iterations that did work.",
            |t| t.busy.as_secs_f64(),
        ),
        (
            "pollux_thread_idle_seconds_total",
            Kind::Counter,
            "Time a runtime thread spent polling without finding work.",
            |t| t.idle.as_secs_f64(),
        ),
        (
            "pollux_thread_asleep_seconds_total",
            Kind::Counter,
            "Time a runtime thread slept in epoll.",
            |t| t.asleep.as_secs_f64(),
        ),
        (
            "pollux_thread_loops_total",
            Kind::Counter,
            "Iterations of a runtime thread's loop.",
            |t| t.loops as f64,
        ),
        (
            "pollux_thread_messages_total",
            Kind::Counter,
            "Messages a runtime thread ran.",
            |t| t.messages as f64,
        ),
        (
            "pollux_thread_pollers",
            Kind::Gauge,
            "Pollers registered on a runtime thread.",
            |t| t.pollers.len() as f64,
        ),
    ];
    for (name, kind, help, get) in fams {
        let mut f = e.family(name, kind, help);
        for t in stats {
            let (i, c) = (t.index.to_string(), t.core.to_string());
            f.sample(&[("thread", &i), ("core", &c)], get(t));
        }
    }
}

/// Each bdev's I/O counters (SPDK's `bdev_get_iostat`).
pub fn bdevs(e: &mut Exposition, stats: &[(String, BdevStats)]) {
    type Get = fn(&BdevStats) -> f64;
    let fams: [(&str, &str, Get); 6] = [
        ("pollux_bdev_read_ops_total", "Read requests.", |s| {
            s.reads as f64
        }),
        ("pollux_bdev_write_ops_total", "Write requests.", |s| {
            s.writes as f64
        }),
        ("pollux_bdev_read_bytes_total", "Bytes read.", |s| {
            s.read_bytes as f64
        }),
        ("pollux_bdev_written_bytes_total", "Bytes written.", |s| {
            s.write_bytes as f64
        }),
        (
            "pollux_bdev_other_ops_total",
            "Other requests (flush, unmap, write zeroes).",
            |s| s.others as f64,
        ),
        (
            "pollux_bdev_errors_total",
            "Requests completed with an error.",
            |s| s.errors as f64,
        ),
    ];
    for (name, help, get) in fams {
        let mut f = e.family(name, Kind::Counter, help);
        for (b, s) in stats {
            f.sample(&[("bdev", b)], get(s));
        }
    }
}

/// A gauge family with one unlabelled sample.
pub fn gauge(e: &mut Exposition, name: &str, help: &str, v: f64) {
    e.family(name, Kind::Gauge, help).sample(&[], v);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn thread_and_bdev_counters_by_label() {
        let mut e = Exposition::default();
        let t = ThreadStats {
            index: 1,
            core: 3,
            busy: Duration::from_millis(1500),
            loops: 7,
            ..Default::default()
        };
        threads(&mut e, &[t]);
        let b = BdevStats {
            reads: 5,
            read_bytes: 20480,
            ..Default::default()
        };
        bdevs(&mut e, &[("Null0".into(), b)]);
        let s = e.finish();
        assert!(
            s.contains("pollux_thread_busy_seconds_total{thread=\"1\",core=\"3\"} 1.5\n"),
            "{s}"
        );
        assert!(
            s.contains("pollux_thread_loops_total{thread=\"1\",core=\"3\"} 7\n"),
            "{s}"
        );
        assert!(
            s.contains("pollux_bdev_read_ops_total{bdev=\"Null0\"} 5\n"),
            "{s}"
        );
        assert!(
            s.contains("pollux_bdev_read_bytes_total{bdev=\"Null0\"} 20480\n"),
            "{s}"
        );
        assert!(
            s.contains("# TYPE pollux_bdev_errors_total counter\n"),
            "{s}"
        );
    }
}
