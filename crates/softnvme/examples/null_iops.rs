//! Rough single-thread measurement of the device's per-command cost: a
//! minimal host submits batches of 4 KiB reads to a null namespace and
//! steps the device itself. `cargo run --release --example null_iops -p
//! pollux-softnvme [seconds] [queue_depth]`.
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_spec::regs::{cq_head_doorbell, off, sq_tail_doorbell, Aqa, Cc};
use pollux_spec::{Cqe, NvmOpcode, Sqe};

const IOVA: u64 = 0x100000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let qd: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Null,
            lba_shift: 12,
            size_bytes: 1 << 40,
        }],
        ..Default::default()
    })
    .unwrap();
    let mem_len = 8 << 20;
    // SAFETY: fresh anonymous mapping, kept for the whole run.
    let mem = unsafe {
        libc::mmap(
            ptr::null_mut(),
            mem_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    }
    .cast::<u8>();
    // SAFETY: the mapping is fresh and lives to the end of main; the device is unmapped first at exit.
    unsafe {
        dev.dma_map(IOVA, NonNull::new(mem).unwrap(), mem_len)
            .unwrap()
    };
    let (bar, _) = dev.bar0();
    // SAFETY: offsets used are register offsets inside BAR0, which lives as long as `dev`.
    let reg = |o: usize| unsafe { &*bar.as_ptr().add(o).cast::<AtomicU32>() };
    // SAFETY: offsets used are inside the mapping allocated above.
    let at = |off: usize| unsafe { mem.add(off) };
    // Admin queues at 0 / 4K, I/O CQ at 64K, I/O SQ at 128K, data at 1M.
    reg(off::AQA).store(Aqa::new(16, 16).0, Ordering::Release);
    reg(off::ASQ).store(IOVA as u32, Ordering::Release);
    reg(off::ACQ).store((IOVA + 4096) as u32, Ordering::Release);
    reg(off::CC).store(Cc::standard(0).with_en(true).0, Ordering::Release);
    dev.step();
    let size = 1024u32;
    let admin = [
        Sqe::create_io_cq(1, size as u16, IOVA + 0x10000),
        Sqe::create_io_sq(1, size as u16, 1, IOVA + 0x20000),
    ];
    for (i, s) in admin.iter().enumerate() {
        // SAFETY: slot i of the admin SQ, inside the mapping.
        unsafe { ptr::write_volatile(at(i * 64).cast::<Sqe>(), *s) };
    }
    reg(sq_tail_doorbell(0, 0)).store(2, Ordering::Release);
    dev.step();
    let sq = at(0x20000).cast::<Sqe>();
    let cq = at(0x10000).cast::<Cqe>();
    let (mut tail, mut head, mut phase) = (0u32, 0u32, true);
    let mut outstanding = 0u32;
    let mut done = 0u64;
    let t0 = Instant::now();
    let end = Duration::from_secs_f64(secs);
    let mut cmd = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
    cmd.prp1 = IOVA + (1 << 20);
    while t0.elapsed() < end {
        for _ in 0..10 {
            while outstanding < qd {
                cmd.cid = tail as u16;
                cmd.cdw10 = tail;
                // SAFETY: tail < queue entries; the SQ lies inside the mapping.
                unsafe { ptr::write_volatile(sq.add(tail as usize), cmd) };
                tail = (tail + 1) % size;
                outstanding += 1;
            }
            reg(sq_tail_doorbell(1, 0)).store(tail, Ordering::Release);
            dev.step();
            let mut n = 0;
            loop {
                // SAFETY: dword 3 of a CQ entry inside the mapping, read atomically.
                let dw3 = unsafe {
                    &*cq.add(head as usize)
                        .cast::<u8>()
                        .add(12)
                        .cast::<AtomicU32>()
                }
                .load(Ordering::Acquire);
                if ((dw3 >> 16) & 1 != 0) != phase {
                    break;
                }
                head += 1;
                if head == size {
                    head = 0;
                    phase = !phase;
                }
                n += 1;
            }
            reg(cq_head_doorbell(1, 0)).store(head, Ordering::Release);
            outstanding -= n;
            done += n as u64;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    println!(
        "{done} reads in {el:.2} s: {:.2} M IOPS (host + device on one thread, qd {qd}); stats {:?}",
        done as f64 / el / 1e6,
        dev.stats()
    );
}
