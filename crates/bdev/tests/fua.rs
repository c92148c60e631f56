//! Force Unit Access through the bdev layer: no FUA write completes
//! before its data is durable, and a FUA read commits cached writes of
//! its blocks first, on every backend that has a volatile cache to get
//! around:
//! - RAM with a simulated volatile write cache (`ram_with_volatile_cache`:
//!   what was not committed is lost by `lose_volatile_cache`);
//! - io_uring on a buffered file, whose page cache is observed with
//!   `cachestat(2)` (Linux 6.5+; skipped with a message otherwise, and on
//!   file systems without writeback such as tmpfs): a FUA request's pages
//!   are neither dirty nor under writeback once it completes;
//! - NVMe: the FUA bit goes through the driver to the emulated controller,
//!   whose namespace is a RAM disk with a simulated cache.
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::{
    Bdev, Channel, ChannelOptions, Completion, Data, Io, IoBuf, RawSeg, RwFlags, UringOptions,
};
use pollux_host::{ControllerOptions, QpairOptions};
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

fn fill(b: &mut IoBuf, seed: u8) {
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = seed ^ (i * 31 % 251) as u8;
    }
}

fn expected(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i * 31 % 251) as u8).collect()
}

/// Polls until every request is back; the completions by user data.
fn drain(ch: &mut Channel) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut h = |_: &mut Io<'_>, c: Completion| out.push(c);
    assert!(ch.drain(&mut h, 50_000_000), "channel did not drain");
    out.sort_by_key(|c| c.user_data);
    for c in &out {
        assert!(c.result.is_ok(), "request {}: {:?}", c.user_data, c.result);
    }
    out
}

fn bytes(d: Data) -> Vec<u8> {
    d.into_vec()
        .iter()
        .flat_map(|b| b.as_slice().to_vec())
        .collect()
}

// ---------------------------------------------------------------------
// RAM with a simulated volatile write cache.

fn cached_ram(blocks: u64) -> Bdev {
    Bdev::ram_with_volatile_cache("Cache0", 512, blocks).unwrap()
}

fn read_back(b: &Bdev, ch: &mut Channel, lba: u64, len: usize) -> Vec<u8> {
    ch.read(lba, b.alloc_buf(len).unwrap(), 99).unwrap();
    bytes(std::mem::take(&mut drain(ch)[0].data))
}

#[test]
fn simulated_cache_loses_what_was_not_committed() {
    let b = cached_ram(256);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    // Plain writes stay in the cache: a power loss takes them.
    let mut w = b.alloc_buf(4096).unwrap();
    fill(&mut w, 1);
    ch.write(0, w, 1).unwrap();
    drain(&mut ch);
    assert_eq!(
        read_back(&b, &mut ch, 0, 4096),
        expected(4096, 1),
        "reads see the cache"
    );
    assert_eq!(b.lose_volatile_cache(), Some(8));
    assert!(read_back(&b, &mut ch, 0, 4096).iter().all(|&x| x == 0));
    // A FUA write is committed before it completes.
    let mut w = b.alloc_buf(4096).unwrap();
    fill(&mut w, 2);
    ch.write_with(8, w, RwFlags::FUA, 2).unwrap();
    drain(&mut ch);
    assert_eq!(b.lose_volatile_cache(), Some(0));
    assert_eq!(read_back(&b, &mut ch, 8, 4096), expected(4096, 2));
    // Flush commits every cached write, write zeroes included.
    let mut w = b.alloc_buf(1024).unwrap();
    fill(&mut w, 3);
    ch.write(100, w, 3).unwrap();
    ch.write_zeroes(8, 2, 4).unwrap();
    drain(&mut ch);
    ch.flush_cache(5).unwrap();
    drain(&mut ch);
    assert_eq!(b.lose_volatile_cache(), Some(0));
    assert_eq!(read_back(&b, &mut ch, 100, 1024), expected(1024, 3));
    let z = read_back(&b, &mut ch, 8, 4096);
    assert!(z[..1024].iter().all(|&x| x == 0));
    assert_eq!(&z[1024..], &expected(4096, 2)[1024..]);
    // A FUA read commits the cached writes of its blocks (only those).
    let mut w = b.alloc_buf(2048).unwrap();
    fill(&mut w, 4);
    ch.write(200, w, 6).unwrap();
    drain(&mut ch);
    ch.read_with(200, b.alloc_buf(1024).unwrap(), RwFlags::FUA, 7)
        .unwrap();
    let c = drain(&mut ch);
    assert_eq!(bytes(c.into_iter().next().unwrap().data), expected(1024, 4));
    assert_eq!(
        b.lose_volatile_cache(),
        Some(2),
        "the two blocks past the read"
    );
    assert_eq!(
        &read_back(&b, &mut ch, 200, 1024)[..],
        &expected(1024, 4)[..]
    );
    // Other bdevs have no simulated cache.
    let plain: Bdev = Bdev::ram("Plain0", 512, 8).unwrap();
    assert_eq!(plain.lose_volatile_cache(), None);
}

#[test]
fn vectors_and_lent_memory_honour_fua_on_ram() {
    let b = cached_ram(256);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let v: Vec<IoBuf> = (0..3)
        .map(|i| {
            let mut x = b.alloc_buf(1024).unwrap();
            fill(&mut x, 10 + i);
            x
        })
        .collect();
    ch.writev_with(0, v, RwFlags::FUA, 1).unwrap();
    let mut src = expected(2048, 20);
    let seg = [RawSeg {
        ptr: src.as_mut_ptr(),
        len: src.len(),
    }];
    // SAFETY: `src` outlives the requests (drained below) and is not
    // touched meanwhile.
    unsafe {
        ch.io().writev_raw_with(50, &seg, RwFlags::FUA, 2).unwrap();
        // Finished within the call: no completion follows.
        assert_eq!(ch.writev_raw_now_with(60, &seg, RwFlags::FUA), Some(Ok(())));
        // Without FUA: cached.
        assert_eq!(ch.writev_raw_now(70, &seg), Some(Ok(())));
    }
    drain(&mut ch);
    assert_eq!(
        b.lose_volatile_cache(),
        Some(4),
        "only the plain write is lost"
    );
    let all: Vec<u8> = (0..3).flat_map(|i| expected(1024, 10 + i)).collect();
    assert_eq!(read_back(&b, &mut ch, 0, 3072), all);
    assert_eq!(read_back(&b, &mut ch, 50, 2048), src);
    assert_eq!(read_back(&b, &mut ch, 60, 2048), src);
    assert!(read_back(&b, &mut ch, 70, 2048).iter().all(|&x| x == 0));
}

// ---------------------------------------------------------------------
// io_uring on a buffered file, observed through cachestat(2).

/// cachestat(2)'s syscall number (the same on every architecture).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
#[derive(Default, Debug)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The page cache state of `[off, off + len)` of `f`; None when the
/// kernel has no cachestat.
fn cachestat(f: &std::fs::File, off: u64, len: u64) -> Option<Cachestat> {
    let r = CachestatRange { off, len };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads `r` and writes `cs`, both live C structs of
    // the kernel's layout; the descriptor is open.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &r as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    (rc == 0).then_some(cs)
}

const TMPFS_MAGIC: u64 = 0x0102_1994;

/// A directory on a file system with writeback (not tmpfs), if any.
fn writeback_dir() -> Option<PathBuf> {
    let c = [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    ];
    c.into_iter().find(|d| {
        let Ok(p) = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: statfs writes one struct statfs, for which zeroes are
        // valid; `p` is a NUL-terminated path.
        let (rc, st) = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            (libc::statfs(p.as_ptr(), &mut st), st)
        };
        rc == 0 && (st.f_type as u64) & 0xFFFF_FFFF != TMPFS_MAGIC
    })
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A buffered io_uring bdev on a fresh file, the file (to observe), or
/// None (with a message) where the page cache cannot be observed.
fn buffered(tag: &str, size: u64) -> Option<(TempFile, Bdev, std::fs::File)> {
    let Some(dir) = writeback_dir() else {
        eprintln!("skipped: no directory on a file system with writeback");
        return None;
    };
    let p = dir.join(format!("pollux-fua-{}-{tag}", std::process::id()));
    std::fs::File::create(&p).unwrap();
    let t = TempFile(p);
    let o = UringOptions {
        direct: false,
        size: Some(size),
        ..Default::default()
    };
    let b = Bdev::uring("u", &t.0, o).unwrap();
    let f = std::fs::File::open(&t.0).unwrap();
    if cachestat(&f, 0, size).is_none() {
        eprintln!("skipped: the kernel has no cachestat(2) (Linux 6.5+)");
        return None;
    }
    Some((t, b, f))
}

/// Pages of `[off, off + len)` not yet durable: dirty or under writeback.
fn undurable(f: &std::fs::File, off: u64, len: u64) -> u64 {
    let c = cachestat(f, off, len).expect("cachestat");
    c.nr_dirty + c.nr_writeback
}

#[test]
fn uring_fua_write_is_durable_at_completion() {
    let Some((_t, b, f)) = buffered("write", 1 << 20) else {
        return;
    };
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    // A plain write first: its pages are dirty in the page cache (unless
    // writeback got to them already, which would make this control void
    // but not the assertions below).
    let mut w = b.alloc_buf(8192).unwrap();
    fill(&mut w, 1);
    ch.write(0, w, 1).unwrap();
    drain(&mut ch);
    let control = undurable(&f, 0, 8192);
    eprintln!("plain write: {control} of 2 pages not durable at completion");
    // FUA writes of each kind: registered buffer (WRITE_FIXED), plain
    // memory (WRITE), a vector (WRITEV), lent memory (WRITEV). Each is
    // checked as soon as it completes.
    let mut lent = expected(8192, 6);
    let seg = [RawSeg {
        ptr: lent.as_mut_ptr(),
        len: lent.len(),
    }];
    for (i, lba) in [64u64, 128, 192, 256].into_iter().enumerate() {
        match i {
            0 => {
                let mut w = b.alloc_buf(8192).unwrap();
                fill(&mut w, 2);
                ch.write_with(lba, w, RwFlags::FUA, 10).unwrap();
            }
            1 => {
                let mut w = pollux_bdev::mem::alloc_host_buf(8192).unwrap();
                fill(&mut w, 3);
                ch.write_with(lba, w, RwFlags::FUA, 11).unwrap();
            }
            2 => {
                let v: Vec<IoBuf> = (0..2)
                    .map(|k| {
                        let mut x = b.alloc_buf(4096).unwrap();
                        fill(&mut x, 4 + k);
                        x
                    })
                    .collect();
                ch.writev_with(lba, v, RwFlags::FUA, 12).unwrap();
            }
            // SAFETY: `lent` outlives the request (drained below) and is
            // not touched meanwhile.
            _ => unsafe { ch.io().writev_raw_with(lba, &seg, RwFlags::FUA, 13) }.unwrap(),
        }
        drain(&mut ch);
        assert_eq!(
            undurable(&f, lba * 512, 8192),
            0,
            "FUA write {i} completed with pages not yet durable"
        );
    }
    // The data is there.
    for (lba, want) in [
        (64, expected(8192, 2)),
        (128, expected(8192, 3)),
        (192, [expected(4096, 4), expected(4096, 5)].concat()),
        (256, lent.clone()),
    ] {
        assert_eq!(read_back(&b, &mut ch, lba, 8192), want, "LBA {lba}");
    }
}

#[test]
fn uring_fua_read_commits_cached_writes_first() {
    let Some((_t, b, f)) = buffered("read", 1 << 20) else {
        return;
    };
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    for (seed, lba) in [(1u8, 0u64), (2, 64)] {
        let mut w = b.alloc_buf(8192).unwrap();
        fill(&mut w, seed);
        ch.write(lba, w, seed as u64).unwrap();
    }
    drain(&mut ch);
    eprintln!(
        "plain writes: {} of 4 pages not durable at completion",
        undurable(&f, 0, 64 * 512 + 8192)
    );
    // A FUA read (one buffer), then a FUA vector read: each returns the
    // data, durable by then.
    ch.read_with(0, b.alloc_buf(8192).unwrap(), RwFlags::FUA, 1)
        .unwrap();
    let c = drain(&mut ch);
    assert_eq!(
        undurable(&f, 0, 8192),
        0,
        "FUA read completed before its blocks were durable"
    );
    assert_eq!(bytes(c.into_iter().next().unwrap().data), expected(8192, 1));
    let (x, y) = b.alloc_buf(8192).unwrap().split_at(4096);
    ch.readv_with(64, vec![x, y], RwFlags::FUA, 2).unwrap();
    let c = drain(&mut ch);
    assert_eq!(undurable(&f, 64 * 512, 8192), 0);
    assert_eq!(bytes(c.into_iter().next().unwrap().data), expected(8192, 2));
}

// ---------------------------------------------------------------------
// NVMe: the bit reaches the controller (emulated, inline), whose
// namespace is a RAM disk with a simulated cache.

fn nvme_over_cached_ram(mdts: u8) -> (Bdev, Arc<pollux_host::Controller>, Bdev) {
    let ram = cached_ram(8192);
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Bdev(ram.clone()),
            lba_shift: 9,
            size_bytes: 8192 * 512,
        }],
        mdts,
        ..SoftConfig::default()
    })
    .unwrap();
    let ctrl = Arc::new(pollux_host::Controller::from(
        pollux_pcie::open(
            Box::new(SoftPlatform::new(dev, SoftMode::Inline)),
            ControllerOptions {
                admin_timeout: Duration::from_secs(5),
                ..ControllerOptions::default()
            },
        )
        .unwrap(),
    ));
    let b = Bdev::nvme("nvme0n1", ctrl.clone(), 1, QpairOptions::default()).unwrap();
    (ram, ctrl, b)
}

#[test]
fn nvme_backend_passes_fua_through() {
    // MDTS 1: 8 KiB per command, so a 24 KiB FUA write is three commands,
    // each with FUA.
    let (ram, _ctrl, b) = nvme_over_cached_ram(1);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let mut w = b.alloc_buf(24 << 10).unwrap();
    fill(&mut w, 1);
    ch.write_with(0, w, RwFlags::FUA, 1).unwrap();
    let mut w = b.alloc_buf(4096).unwrap();
    fill(&mut w, 2);
    ch.write(100, w, 2).unwrap();
    let v: Vec<IoBuf> = (0..2)
        .map(|k| {
            let mut x = b.alloc_buf(4096).unwrap();
            fill(&mut x, 3 + k);
            x
        })
        .collect();
    ch.writev_with(200, v, RwFlags::FUA, 3).unwrap();
    drain(&mut ch);
    assert_eq!(
        ram.lose_volatile_cache(),
        Some(8),
        "only the plain write is lost"
    );
    assert_eq!(read_back(&b, &mut ch, 0, 24 << 10), expected(24 << 10, 1));
    assert!(read_back(&b, &mut ch, 100, 4096).iter().all(|&x| x == 0));
    assert_eq!(
        read_back(&b, &mut ch, 200, 8192),
        [expected(4096, 3), expected(4096, 4)].concat()
    );
    // A FUA read commits the cached writes of its blocks.
    let mut w = b.alloc_buf(4096).unwrap();
    fill(&mut w, 5);
    ch.write(300, w, 4).unwrap();
    drain(&mut ch);
    ch.read_with(300, b.alloc_buf(4096).unwrap(), RwFlags::FUA, 5)
        .unwrap();
    assert_eq!(
        bytes(std::mem::take(&mut drain(&mut ch)[0].data)),
        expected(4096, 5)
    );
    assert_eq!(ram.lose_volatile_cache(), Some(0));
}

#[test]
fn host_api_fua_reaches_the_controller() {
    // The driver's own API, no bdev layer: owned and borrowed buffers.
    let (ram, ctrl, _b) = nvme_over_cached_ram(5);
    let ns = ctrl.namespace(1).unwrap();
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut a = IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(4096);
    fill(&mut a, 1);
    let mut p = IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(4096);
    fill(&mut p, 2);
    let mut d = ctrl.alloc_dma(4096).unwrap();
    d.as_mut_slice()[..4096].copy_from_slice(&expected(4096, 3));
    {
        let mut sub = qp.submitter();
        sub.write_with(&ns, 0, 8, a, RwFlags::FUA, 1).unwrap();
        sub.write(&ns, 8, 8, p, 2).unwrap();
        // SAFETY: `d` lives and is untouched until the completions are in.
        unsafe { sub.write_dma_with(&ns, 16, 8, d.slice(0..4096), RwFlags::FUA, 3) }.unwrap();
    }
    let n = qp
        .drain(Duration::from_secs(20), |_, c: pollux_nvme::Completion| {
            assert!(c.result.is_ok(), "{:?}", c.result);
        })
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        ram.lose_volatile_cache(),
        Some(8),
        "only the plain write is lost"
    );
    let mut ch = ram.open(true).channel(&ChannelOptions::default()).unwrap();
    assert_eq!(read_back(&ram, &mut ch, 0, 4096), expected(4096, 1));
    assert!(read_back(&ram, &mut ch, 8, 4096).iter().all(|&x| x == 0));
    assert_eq!(read_back(&ram, &mut ch, 16, 4096), expected(4096, 3));
}
