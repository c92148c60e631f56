//! Random reads at a fixed queue depth on one io_uring channel, for a
//! quick figure to set beside fio's io_uring engine:
//!
//! ```text
//! cargo run --release -p pollux-bdev --example uring_qd -- FILE [options]
//! fio --name=r --filename=FILE --ioengine=io_uring --direct=1 \
//!     --rw=randread --bs=4k --iodepth=32 --runtime=2 --time_based
//! ```
//!
//! Options: `--secs N` (2), `--qd N` (32), `--bs BYTES` (4096),
//! `--buffered` (no O_DIRECT), `--no-fixed-bufs`, `--no-fixed-files`,
//! `--no-wake-fd`, `--sqpoll MS`, `--wait` (sleep on the channel's
//! wake_fd whenever a poll finds nothing, as an idle runtime thread
//! would: the CPU time per I/O is then the work each I/O costs, user and
//! kernel, rather than mostly polling). The file is read as it is (write it
//! fully first, or reads of holes never reach the device). Prints IOPS,
//! the process's CPU time per second of wall time (the channel polls
//! without sleeping, so it is mostly user time) and its system time per
//! I/O (the kernel's submission and completion work done in the process).
use std::time::{Duration, Instant};

use pollux_bdev::{Bdev, ChannelOptions, Completion, Handler, Io, UringOptions};

struct Args {
    path: String,
    secs: f64,
    qd: u32,
    bs: usize,
    opts: UringOptions,
    /// Sleep on the channel's wake_fd when a poll finds nothing.
    wait: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        path: String::new(),
        secs: 2.0,
        qd: 32,
        bs: 4096,
        opts: UringOptions::default(),
        wait: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match x.as_str() {
            "--secs" => a.secs = val("--secs")?.parse().map_err(|e| format!("--secs: {e}"))?,
            "--qd" => a.qd = val("--qd")?.parse().map_err(|e| format!("--qd: {e}"))?,
            "--bs" => a.bs = val("--bs")?.parse().map_err(|e| format!("--bs: {e}"))?,
            "--sqpoll" => {
                a.opts.sqpoll = Some(
                    val("--sqpoll")?
                        .parse()
                        .map_err(|e| format!("--sqpoll: {e}"))?,
                )
            }
            "--buffered" => a.opts.direct = false,
            "--wait" => a.wait = true,
            "--no-fixed-bufs" => a.opts.register_buffers = false,
            "--no-fixed-files" => a.opts.register_files = false,
            "--no-wake-fd" => a.opts.wake_fd = false,
            p if !p.starts_with("--") && a.path.is_empty() => a.path = p.to_string(),
            o => return Err(format!("unknown argument {o}")),
        }
    }
    if a.path.is_empty() {
        return Err(
            "usage: uring_qd FILE [--secs N] [--qd N] [--bs BYTES] [--buffered] \
                    [--no-fixed-bufs] [--no-fixed-files] [--no-wake-fd] [--sqpoll MS] [--wait]"
                .into(),
        );
    }
    Ok(a)
}

/// Resubmits each finished read at a new random offset until stopped.
struct Reader {
    rng: u64,
    /// Requests fit in `[0, slots)` units of `nlb` blocks.
    slots: u64,
    nlb: u64,
    done: u64,
    errors: u64,
    stop: bool,
}

impl Reader {
    #[inline(always)]
    fn next_lba(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.slots) * self.nlb
    }
}

impl Handler for Reader {
    #[inline(always)]
    fn complete(&mut self, io: &mut Io<'_>, c: Completion) {
        self.done += 1;
        if c.result.is_err() {
            self.errors += 1;
        }
        if self.stop {
            return;
        }
        if let Some(buf) = c.data.into_one() {
            let lba = self.next_lba();
            if io.read(lba, buf, 0).is_err() {
                self.errors += 1;
            }
        }
    }
}

/// Sleeps until the channel's wake_fd is signalled (or 10 ms), then
/// clears it.
fn sleep_on(ch: &pollux_bdev::Channel) {
    use std::os::fd::AsRawFd;
    let Some(fd) = ch.wake_fd() else {
        return;
    };
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut v = 0u64;
    // SAFETY: one pollfd for poll; read writes 8 bytes into `v`.
    unsafe {
        if libc::poll(&mut p, 1, 10) == 1 {
            libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }
}

/// User and system CPU seconds of the process so far.
fn cpu_secs() -> (f64, f64) {
    // SAFETY: getrusage writes one rusage into the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    (t(ru.ru_utime), t(ru.ru_stime))
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let b: Bdev = match Bdev::uring("bench", &a.path, a.opts.clone()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let info = b.info().clone();
    let nlb = (a.bs as u64 / info.block_size as u64).max(1);
    let mut ch = match b.open(false).channel(&ChannelOptions {
        depth: a.qd,
        ..Default::default()
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut r = Reader {
        rng: 0x1234_5678_9abc_def1,
        slots: info.num_blocks / nlb,
        nlb,
        done: 0,
        errors: 0,
        stop: false,
    };
    for _ in 0..a.qd {
        let buf = match b.alloc_buf(a.bs) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let lba = r.next_lba();
        if let Err(e) = ch.read(lba, buf, 0) {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
    // Warm up, then measure.
    let warm = Instant::now() + Duration::from_millis(300);
    while Instant::now() < warm {
        if ch.poll(u32::MAX, &mut r) == 0 && a.wait {
            sleep_on(&ch);
        }
    }
    let (d0, c0, t0) = (r.done, cpu_secs(), Instant::now());
    let end = t0 + Duration::from_secs_f64(a.secs);
    let mut polls = 0u64;
    loop {
        if ch.poll(u32::MAX, &mut r) == 0 && a.wait {
            sleep_on(&ch);
        }
        polls += 1;
        if polls.is_multiple_of(64) && Instant::now() >= end {
            break;
        }
    }
    let (d1, c1, t1) = (r.done, cpu_secs(), Instant::now());
    r.stop = true;
    ch.drain(&mut r, 1_000_000);
    let wall = (t1 - t0).as_secs_f64();
    let ios = (d1 - d0) as f64;
    println!(
        "uring_qd {} bs={} qd={} direct={} fixed_bufs={} fixed_files={} wake_fd={} sqpoll={:?} \
         wait={}: {:.0} IOPS, cpu {:.0}% (user {:.0}%, sys {:.0}%), cpu {:.2} us/IO, errors {}",
        a.path,
        a.bs,
        a.qd,
        a.opts.direct,
        a.opts.register_buffers,
        a.opts.register_files,
        a.opts.wake_fd,
        a.opts.sqpoll,
        a.wait,
        ios / wall,
        100.0 * (c1.0 + c1.1 - c0.0 - c0.1) / wall,
        100.0 * (c1.0 - c0.0) / wall,
        100.0 * (c1.1 - c0.1) / wall,
        1e6 * (c1.0 + c1.1 - c0.0 - c0.1) / ios.max(1.0),
        r.errors
    );
}
