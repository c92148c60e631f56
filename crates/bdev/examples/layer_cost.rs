//! The block-device layer's cost over NVMe: 4 KiB random reads at QD 128
//! on an inline emulated controller (null backend), either through a bdev
//! channel or straight through the host library's queue pair, with the same
//! loop. Run under callgrind with two I/O counts and subtract to get the
//! layer's instructions per I/O (bench/bench.py does).
//!
//! `cargo run --release -p pollux-bdev --example layer_cost -- bdev|qpair|null IOS`
//! (`null`: the null bdev, no controller: the layer's whole cost).
use std::sync::Arc;

use pollux_bdev::{Bdev, ChannelOptions, Completion, Io, IoBuf};
use pollux_host::{ControllerOptions, QpairOptions};
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

const DEPTH: u64 = 128;
const BS: usize = 4096;

struct Job {
    rng: u64,
    units: u64,
    left: u64,
    done: u64,
    errors: u64,
    /// The namespace read in `qpair` mode.
    ns: Option<pollux_host::Namespace>,
}

impl Job {
    #[inline(always)]
    fn next_lba(&mut self) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (((self.rng as u128) * self.units as u128) >> 64) as u64 * 8
    }
}

impl pollux_bdev::Handler for Job {
    #[inline(always)]
    fn complete(&mut self, io: &mut Io<'_>, c: Completion) {
        self.done += 1;
        if c.result.is_err() {
            self.errors += 1;
        }
        if self.left > 0 {
            self.left -= 1;
            if let Some(buf) = c.data.into_one() {
                let lba = self.next_lba();
                if io.read(lba, buf, c.user_data).is_err() {
                    self.errors += 1;
                }
            }
        }
    }
}

impl pollux_host::Handler for Job {
    #[inline(always)]
    fn complete(&mut self, sub: &mut pollux_host::Submitter<'_>, c: pollux_host::Completion) {
        self.done += 1;
        if c.result.is_err() {
            self.errors += 1;
        }
        if self.left > 0 {
            self.left -= 1;
            if let (Some(buf), Some(ns)) = (c.buf, self.ns) {
                let lba = self.next_lba();
                if sub.read(&ns, lba, 8, buf, c.user_data).is_err() {
                    self.errors += 1;
                }
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("bdev");
    let ios: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Null,
            lba_shift: 9,
            size_bytes: 1 << 30,
        }],
        ..SoftConfig::default()
    })?;
    let ctrl = Arc::new(pollux_host::Controller::from(pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions::default(),
    )?));
    let mut job = Job {
        rng: 12345,
        units: (1 << 21) / 8,
        left: ios.saturating_sub(DEPTH),
        done: 0,
        errors: 0,
        ns: None,
    };
    let t0 = std::time::Instant::now();
    match mode {
        "bdev" => {
            let b: Bdev = Bdev::nvme("n1", ctrl.clone(), 1, QpairOptions::default())?;
            let mut ch = b.open(false).channel(&ChannelOptions::default())?;
            let bufs = b.alloc_buf(DEPTH as usize * BS)?.chunks(BS);
            for (i, buf) in bufs.into_iter().enumerate() {
                let lba = job.next_lba();
                ch.read(lba, buf, i as u64).map_err(|r| r.error)?;
            }
            while job.done < ios {
                ch.poll(u32::MAX, &mut job);
                dev.step();
            }
        }
        "null" => {
            let b: Bdev = Bdev::null("null0", 512, 1 << 21)?;
            let mut ch = b.open(false).channel(&ChannelOptions::default())?;
            let bufs = b.alloc_buf(DEPTH as usize * BS)?.chunks(BS);
            for (i, buf) in bufs.into_iter().enumerate() {
                let lba = job.next_lba();
                ch.read(lba, buf, i as u64).map_err(|r| r.error)?;
            }
            while job.done < ios {
                ch.poll(u32::MAX, &mut job);
            }
        }
        _ => {
            let ns = ctrl.namespaces()[0];
            assert_eq!((ns.nsid(), ns.lba_shift(), ns.nsze()), (1, 9, 1 << 21));
            job.ns = Some(ns);
            let mut qp = ctrl.alloc_qpair(QpairOptions::default())?;
            let bufs = IoBuf::new(ctrl.alloc_dma(DEPTH as usize * BS)?).chunks(BS);
            for (i, buf) in bufs.into_iter().enumerate() {
                let lba = job.next_lba();
                qp.read(&ns, lba, 8, buf, i as u64).map_err(|r| r.error)?;
            }
            while job.done < ios {
                qp.poll_with(u32::MAX, &mut job);
                dev.step();
            }
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "{mode}: {} I/Os, {} errors, {:.2} M IOPS (inline)",
        job.done,
        job.errors,
        job.done as f64 / dt / 1e6
    );
    Ok(())
}
