//! Out of descriptors: the target raises its descriptor limit at start,
//! and when `accept` still fails with EMFILE it backs off and warns once
//! (it retried every 200 us and logged each time), then takes the
//! waiting connections once descriptors are free again.
//!
//! One test in its own binary: it changes the process's descriptor limit
//! and installs the global log subscriber.
mod common;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Warnings of the target whose message mentions `accept`.
static ACCEPT_WARNINGS: AtomicUsize = AtomicUsize::new(0);

struct Counter;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            self.0 = format!("{v:?}");
        }
    }
}

impl Subscriber for Counter {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut m = Message(String::new());
        e.record(&mut m);
        if e.metadata().target().starts_with("pollux_nvmf") && m.0.contains("accept") {
            ACCEPT_WARNINGS.fetch_add(1, Relaxed);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    (r.rlim_cur, r.rlim_max)
}

fn set_soft(v: u64) {
    let (_, hard) = nofile();
    let r = libc::rlimit {
        rlim_cur: v,
        rlim_max: hard,
    };
    // SAFETY: `r` is a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
}

/// Lowers the soft limit just above the highest descriptor open and
/// fills the holes below it: no descriptor can be made after this.
fn exhaust() -> Vec<std::fs::File> {
    let top = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap();
    set_soft(top + 1);
    let mut fill = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fill.push(f);
    }
    fill
}

#[test]
fn accept_out_of_descriptors_backs_off_warns_once_and_recovers() {
    tracing::subscriber::set_global_default(Counter).unwrap();
    let (_, hard) = nofile();
    if hard <= 256 {
        eprintln!("skipped: the hard descriptor limit ({hard}) leaves no room to test");
        return;
    }
    // Start raises the soft limit to the hard one.
    set_soft(256);
    let t = common::ram_target(2048);
    assert_eq!(nofile(), (hard, hard), "soft limit not raised at start");
    let addr = match t.listen_addrs()[0] {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    // Sockets made now, connected once no descriptor is left.
    const K: usize = 8;
    let socks: Vec<i32> = (0..K)
        .map(|_| {
            // SAFETY: plain socket(2).
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            assert!(fd >= 0);
            fd
        })
        .collect();
    let fill = exhaust();
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    for &fd in &socks {
        // SAFETY: `sa` is a valid sockaddr_in of the given length.
        let r = unsafe {
            libc::connect(
                fd,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
    }
    // The connections wait in the backlog while accept fails.
    std::thread::sleep(Duration::from_millis(1500));
    let warned = ACCEPT_WARNINGS.load(Relaxed);
    assert_eq!(t.connections(), 0, "accepted without a descriptor");
    set_soft(hard);
    drop(fill);
    assert!(
        warned == 1,
        "{warned} warnings about accept in 1.5 s out of descriptors (want one)"
    );
    // Descriptors free again: every waiting connection is taken.
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.connections() < K && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.connections(), K, "waiting connections not accepted");
    for fd in socks {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
    }
    t.shutdown().unwrap();
}
