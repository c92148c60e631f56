//! io_uring backend: data through one buffer, vectors and borrowed
//! segments (with and without O_DIRECT, registered and plain buffers),
//! flush, write zeroes, unmap, reset, refusals naming the culprit, QD 64
//! accounting, short transfers, injected and OS failures, dropping a
//! channel with I/O in flight, two channels on two threads, wake_fd.
//!
//! Files live in $TMPDIR (or /tmp); when its file system refuses O_DIRECT
//! the direct tests use /var/tmp, then the target's tmp directory.
//! `POLLUX_TEST_BLOCKDEV=/dev/loopN` also runs the round trip on that
//! block device (its contents are destroyed).
use std::collections::HashMap;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_bdev::{
    Bdev, Channel, ChannelOptions, Completion, Data, Error, Io, IoBuf, IoError, RawSeg,
    SubmitError, UringOptions,
};
use pollux_nvme::dma::{DmaRelease, Iova};
use pollux_nvme::DmaBuffer;

/// A file removed when the test ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn accepts_direct(dir: &Path) -> bool {
    let p = dir.join(format!("pollux-uring-probe-{}", std::process::id()));
    let r = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p);
    let _ = std::fs::remove_file(&p);
    r.is_ok()
}

/// A directory whose file system takes O_DIRECT when `direct`.
fn dir(direct: bool) -> PathBuf {
    let mut c = vec![std::env::temp_dir(), PathBuf::from("/var/tmp")];
    c.push(PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    for d in &c {
        if !direct || accepts_direct(d) {
            return d.clone();
        }
    }
    panic!("no directory among {c:?} accepts O_DIRECT");
}

fn temp(tag: &str, direct: bool) -> TempFile {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let p = dir(direct).join(format!("pollux-uring-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    std::fs::File::create(&p).unwrap();
    TempFile(p)
}

fn opts(direct: bool, size: u64) -> UringOptions {
    UringOptions {
        direct,
        size: Some(size),
        ..Default::default()
    }
}

fn chan(b: &Bdev, depth: u32) -> Channel {
    b.open(true)
        .channel(&ChannelOptions {
            depth,
            ..Default::default()
        })
        .unwrap()
}

/// The bytes a pattern with `seed` has at bdev bytes `[off, off + len)`.
fn pattern(off: u64, len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let w = (off + i) / 8;
            ((w.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed) >> ((off + i) % 8 * 8)) as u8
        })
        .collect()
}

fn filled(b: &Bdev, off: u64, len: usize, seed: u64) -> IoBuf {
    let mut buf = b.alloc_buf(len).unwrap();
    buf.as_mut_slice().copy_from_slice(&pattern(off, len, seed));
    buf
}

/// Every completion until nothing is outstanding.
fn drain(ch: &mut Channel) -> Vec<Completion> {
    let mut out = Vec::new();
    let done = ch.drain(&mut |_: &mut Io<'_>, c: Completion| out.push(c), 100_000);
    assert!(done, "requests still outstanding after draining");
    out
}

fn one(ch: &mut Channel) -> Completion {
    let mut c = drain(ch);
    assert_eq!(c.len(), 1, "one completion expected: {c:?}");
    c.pop().unwrap()
}

fn bytes(d: Data) -> Vec<u8> {
    d.into_vec()
        .iter()
        .flat_map(|b| b.as_slice().to_vec())
        .collect()
}

fn file_bytes(p: &Path, off: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(p).unwrap();
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off).unwrap();
    v
}

fn round_trip(b: &Bdev, path: Option<&Path>) {
    let bs = b.info().block_size as u64;
    let mut ch = chan(b, 16);
    // One registered buffer out, a vector of three back.
    let off = 8 * bs;
    ch.write(8, filled(b, off, 16 * bs as usize, 1), 1).unwrap();
    let c = one(&mut ch);
    assert_eq!((c.user_data, c.result), (1, Ok(0)));
    if let Some(p) = path {
        assert_eq!(
            file_bytes(p, off, 16 * bs as usize),
            pattern(off, 16 * bs as usize, 1),
            "the file holds what was written"
        );
    }
    let (a, rest) = b.alloc_buf(16 * bs as usize).unwrap().split_at(bs as usize);
    let (m, z) = rest.split_at(5 * bs as usize);
    ch.readv(8, vec![a, m, z], 2).unwrap();
    let c = one(&mut ch);
    assert_eq!((c.user_data, c.result), (2, Ok(0)));
    assert_eq!(bytes(c.data), pattern(off, 16 * bs as usize, 1));
    // A vector out (plain, unregistered memory), one buffer back.
    let off = 40 * bs;
    let mut v = Vec::new();
    for i in 0..4u64 {
        let mut x = pollux_bdev::mem::alloc_host_buf(2 * bs as usize).unwrap();
        x.as_mut_slice()
            .copy_from_slice(&pattern(off + i * 2 * bs, 2 * bs as usize, 7));
        v.push(x);
    }
    ch.writev(40, v, 3).unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
    let plain = pollux_bdev::mem::alloc_host_buf(8 * bs as usize).unwrap();
    ch.read(40, plain, 4).unwrap();
    let c = one(&mut ch);
    assert_eq!(c.result, Ok(0));
    assert_eq!(bytes(c.data), pattern(off, 8 * bs as usize, 7));
    // The first write is untouched by the second.
    ch.read(8, b.alloc_buf(16 * bs as usize).unwrap(), 5)
        .unwrap();
    assert_eq!(
        bytes(one(&mut ch).data),
        pattern(8 * bs, 16 * bs as usize, 1)
    );
    let s = b.stats();
    assert_eq!((s.reads, s.writes, s.errors), (3, 2, 0));
    assert_eq!(s.write_bytes, 24 * bs);
}

#[test]
fn round_trip_direct_and_buffered() {
    for direct in [true, false] {
        let f = temp("rt", direct);
        let b: Bdev = Bdev::uring("u0", &f.0, opts(direct, 1 << 20)).unwrap();
        let i = b.info();
        assert_eq!(i.backend, "uring");
        assert!(i.caps.host_memory);
        assert_eq!(i.size_bytes(), 1 << 20, "the file was extended to the size");
        assert_eq!(std::fs::metadata(&f.0).unwrap().len(), 1 << 20);
        if direct {
            assert!(i.buf_align >= 4 && i.buf_align.is_power_of_two(), "{i:?}");
        } else {
            assert_eq!(i.buf_align, 1);
        }
        round_trip(&b, Some(&f.0));
    }
}

#[test]
fn round_trip_without_registration_and_with_large_buffers() {
    let f = temp("noreg", true);
    let o = UringOptions {
        register_files: false,
        register_buffers: false,
        wake_fd: false,
        ..opts(true, 64 << 20)
    };
    let b: Bdev = Bdev::uring("u1", &f.0, o).unwrap();
    round_trip(&b, Some(&f.0));
    // Registered regions grow past the first: buffers of 3 MiB come from
    // several regions, each registered by the channel when first seen.
    let f = temp("regions", true);
    let b: Bdev = Bdev::uring("u2", &f.0, opts(true, 64 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let mut ch = chan(&b, 8);
    let len = 3 << 20;
    let mut kept = Vec::new();
    for i in 0..6u64 {
        let off = i * len as u64;
        ch.write(off / bs, filled(&b, off, len, 9), i).unwrap();
        let c = one(&mut ch);
        assert_eq!(c.result, Ok(0));
        kept.push(c.data); // keep them so the next comes from new memory
    }
    for i in 0..6u64 {
        let off = i * len as u64;
        ch.read(off / bs, b.alloc_buf(len).unwrap(), i).unwrap();
        let c = one(&mut ch);
        assert_eq!(c.result, Ok(0));
        assert!(bytes(c.data) == pattern(off, len, 9), "chunk {i}");
    }
}

#[test]
fn round_trip_with_sqpoll() {
    let f = temp("sqpoll", true);
    let o = UringOptions {
        sqpoll: Some(50),
        ..opts(true, 1 << 20)
    };
    let b: Bdev = Bdev::uring("u16", &f.0, o).unwrap();
    round_trip(&b, Some(&f.0));
    zeroing(&b, Some(&f.0));
}

#[test]
fn raw_segments_round_trip() {
    let f = temp("raw", true);
    let b: Bdev = Bdev::uring("u3", &f.0, opts(true, 1 << 20)).unwrap();
    let bs = b.info().block_size as usize;
    let mut ch = chan(&b, 4);
    let src = pollux_bdev::mem::alloc_host(4 * bs).unwrap();
    let dst = pollux_bdev::mem::alloc_host(4 * bs).unwrap();
    let want = pattern(2 * bs as u64, 4 * bs, 5);
    // SAFETY: src is ours, 4 blocks long, and nothing else touches it.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), src.as_ptr(), want.len()) };
    let segs = |m: &DmaBuffer| {
        [
            RawSeg {
                ptr: m.as_ptr(),
                len: bs,
            },
            RawSeg {
                // SAFETY: inside the buffer.
                ptr: unsafe { m.as_ptr().add(bs) },
                len: 3 * bs,
            },
        ]
    };
    // SAFETY: src and dst outlive the requests (drained below) and only
    // the kernel touches them meanwhile.
    unsafe { ch.io().writev_raw(2, &segs(&src), 1).unwrap() };
    let c = one(&mut ch);
    assert_eq!((c.result, c.data.len()), (Ok(0), 0));
    // SAFETY: as above.
    unsafe { ch.io().readv_raw(2, &segs(&dst), 2).unwrap() };
    assert_eq!(one(&mut ch).result, Ok(0));
    assert_eq!(dst.as_slice(), &want[..]);
    // Misaligned borrowed memory is refused naming its address.
    // SAFETY: inside the buffer.
    let bad = unsafe { src.as_ptr().add(1) };
    // SAFETY: refused before anything is started.
    let r = unsafe { ch.io().readv_raw(2, &[RawSeg { ptr: bad, len: bs }], 3) };
    assert_eq!(
        r,
        Err(SubmitError::Unaligned {
            addr: bad as u64,
            align: b.info().buf_align
        })
    );
}

#[test]
fn flush_write_zeroes_unmap_and_reset() {
    let f = temp("zero", true);
    let b: Bdev = Bdev::uring("u4", &f.0, opts(true, 1 << 20)).unwrap();
    zeroing(&b, Some(&f.0));
    // tmpfs refuses ZERO_RANGE: the channel falls back to writing zeroes.
    if Path::new("/dev/shm").is_dir() {
        let p = PathBuf::from(format!("/dev/shm/pollux-uring-{}-zero", std::process::id()));
        std::fs::File::create(&p).unwrap();
        let t = TempFile(p);
        let b: Bdev = Bdev::uring("u5", &t.0, opts(false, 4 << 20)).unwrap();
        zeroing(&b, Some(&t.0));
    }
}

fn zeroing(b: &Bdev, path: Option<&Path>) {
    let bs = b.info().block_size as u64;
    let n = b.info().num_blocks;
    let mut ch = chan(b, 8);
    let all = (n * bs) as usize;
    ch.write(0, filled(b, 0, all, 3), 1).unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
    ch.flush_cache(2).unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
    // Zero blocks 3..7 and unmap 20..40 (and, for the fallback, more
    // than one write's worth: 2 MiB from block n/2 when it fits).
    ch.write_zeroes(3, 4, 3).unwrap();
    ch.unmap(20, 20, 4).unwrap();
    let big = (2 << 20) / bs;
    let big_at = n / 2;
    let big = if big_at + big <= n { big } else { n - big_at };
    ch.write_zeroes(big_at, big, 5).unwrap();
    let mut c = drain(&mut ch);
    c.sort_by_key(|c| c.user_data);
    assert_eq!(
        c.iter()
            .map(|c| (c.user_data, c.result))
            .collect::<Vec<_>>(),
        vec![(3, Ok(0)), (4, Ok(0)), (5, Ok(0))]
    );
    ch.read(0, b.alloc_buf(all).unwrap(), 6).unwrap();
    let got = bytes(one(&mut ch).data);
    let mut want = pattern(0, all, 3);
    for (lba, nlb) in [(3, 4), (20, 20), (big_at, big)] {
        want[(lba * bs) as usize..((lba + nlb) * bs) as usize].fill(0);
    }
    assert!(
        got == want,
        "zeroed ranges read back as zeroes, the rest intact"
    );
    if let Some(p) = path {
        assert!(file_bytes(p, 0, all) == want, "the file agrees");
    }
    // Reset completes after everything submitted before it.
    for i in 0..6 {
        ch.write(i * 8, filled(b, i * 8 * bs, 8 * bs as usize, 4), 10 + i)
            .unwrap();
    }
    ch.reset(99).unwrap();
    let c = drain(&mut ch);
    assert_eq!(c.len(), 7);
    assert_eq!(c.last().map(|c| (c.user_data, c.result)), Some((99, Ok(0))));
}

#[test]
fn bad_requests_are_refused_naming_the_culprit() {
    let f = temp("bad", true);
    let b: Bdev = Bdev::uring("u6", &f.0, opts(true, 1 << 20)).unwrap();
    let bs = b.info().block_size as usize;
    let align = b.info().buf_align;
    let nb = b.info().num_blocks;
    let mut ch = chan(&b, 2);
    let r = ch
        .read(nb - 1, b.alloc_buf(2 * bs).unwrap(), 1)
        .unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::OutOfRange {
            lba: nb - 1,
            nlb: 2,
            num_blocks: nb
        }
    );
    assert_eq!(r.data.len(), 2 * bs, "the buffer comes back");
    let r = ch.write(0, b.alloc_buf(bs + 1).unwrap(), 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::NotBlockMultiple {
            len: bs + 1,
            block_size: bs as u32
        }
    );
    assert_eq!(
        ch.read(0, b.alloc_buf(0).unwrap(), 1).unwrap_err().error,
        SubmitError::ZeroLength
    );
    if align > 1 {
        // Whole blocks at an address off the alignment.
        let mut m = b
            .alloc_buf(2 * bs)
            .unwrap()
            .split_at(align as usize / 2)
            .1
            .truncate(bs);
        let addr = m.as_mut_slice().as_mut_ptr() as u64;
        let r = ch.write(0, m, 1).unwrap_err();
        assert_eq!(r.error, SubmitError::Unaligned { addr, align });
        assert_eq!(r.data.len(), bs);
        let mut m = b
            .alloc_buf(2 * bs)
            .unwrap()
            .split_at(align as usize / 2)
            .1
            .truncate(bs);
        let addr = m.as_mut_slice().as_mut_ptr() as u64;
        let good = b.alloc_buf(bs).unwrap();
        let r = ch.readv(0, vec![good, m], 1).unwrap_err();
        assert_eq!(r.error, SubmitError::Unaligned { addr, align });
        assert_eq!(r.data.into_vec().len(), 2, "both buffers come back");
    }
    let many: Vec<IoBuf> = (0..1025).map(|_| b.alloc_buf(bs).unwrap()).collect();
    let r = ch.readv(0, many, 1).unwrap_err();
    assert_eq!(r.error, SubmitError::TooManySegments { n: 1025, max: 1024 });
    assert!(matches!(
        ch.nvme_passthru(pollux_spec::Sqe::default(), None, 1)
            .unwrap_err()
            .error,
        SubmitError::Unsupported {
            backend: "uring",
            ..
        }
    ));
    // Depth is a limit.
    ch.read(0, b.alloc_buf(bs).unwrap(), 1).unwrap();
    ch.read(1, b.alloc_buf(bs).unwrap(), 2).unwrap();
    let r = ch.read(2, b.alloc_buf(bs).unwrap(), 3).unwrap_err();
    assert_eq!(r.error, SubmitError::QueueFull { depth: 2 });
    assert_eq!(drain(&mut ch).len(), 2);
    let mut ro = b.open(false).channel(&ChannelOptions::default()).unwrap();
    assert_eq!(
        ro.write(0, b.alloc_buf(bs).unwrap(), 1).unwrap_err().error,
        SubmitError::ReadOnly
    );
    let s = b.stats();
    assert_eq!((s.reads, s.writes), (2, 0), "refusals are not counted");
}

#[test]
fn transfers_beyond_a_gibibyte_are_refused() {
    let f = temp("big", true);
    // Sparse: nothing is written.
    let b: Bdev = Bdev::uring("u7", &f.0, opts(true, 2 << 30)).unwrap();
    let mut ch = chan(&b, 2);
    // An untouched mapping: reserves no memory.
    let len = (1 << 30) + 4096;
    let m = IoBuf::new(pollux_bdev::mem::alloc_host(len).unwrap());
    let r = ch.read(0, m, 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::TooLarge {
            len: len as u64,
            max: 1 << 30
        }
    );
}

#[test]
fn bad_bdevs_are_refused_naming_the_culprit() {
    let f = temp("badbdev", true);
    let err = |o: UringOptions| -> String {
        match Bdev::uring("ub", &f.0, o) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    };
    let e = err(UringOptions {
        block_size: Some(256),
        ..opts(true, 1 << 20)
    });
    assert!(e.contains("block_size 256"), "{e}");
    let e = err(opts(true, 1000));
    assert!(e.contains("size 1000"), "{e}");
    let e = err(UringOptions {
        iopoll: true,
        ..opts(true, 1 << 20)
    });
    assert!(e.contains("iopoll") && e.contains("regular file"), "{e}");
    let e = err(UringOptions {
        size: None,
        ..opts(true, 0)
    });
    assert!(e.contains("give UringOptions::size"), "{e}");
    assert!(e.contains(&*f.0.to_string_lossy()), "names the file: {e}");
    let missing = f.0.with_extension("missing");
    let e = Bdev::uring("ub", &missing, opts(true, 1 << 20))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains(&*missing.to_string_lossy()), "{e}");
    let e = Bdev::uring("ub", std::env::temp_dir(), opts(false, 1 << 20))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(!e.is_empty(), "a directory is refused");
    let b: Bdev = Bdev::uring("ub", &f.0, opts(true, 1 << 20)).unwrap();
    let r = b.open(true).channel(&ChannelOptions {
        depth: 40000,
        ..Default::default()
    });
    assert!(
        matches!(&r, Err(Error::Invalid { msg, .. }) if msg.contains("40000")),
        "{:?}",
        r.err()
    );
}

#[test]
fn qd64_every_completion_exactly_once() {
    let f = temp("qd", true);
    let b: Bdev = Bdev::uring("u8", &f.0, opts(true, 4 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let nb = b.info().num_blocks;
    let mut ch = chan(&b, 64);
    ch.write(0, filled(&b, 0, (nb * bs) as usize, 11), 0)
        .unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
    let total = 2000u64;
    let lba_of = |ud: u64| (ud * 37) % nb;
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut next = 0u64;
    for _ in 0..64 {
        ch.read(lba_of(next), b.alloc_buf(bs as usize).unwrap(), next)
            .unwrap();
        next += 1;
    }
    let mut bad = 0;
    let mut h = |io: &mut Io<'_>, c: Completion| {
        *seen.entry(c.user_data).or_default() += 1;
        let off = lba_of(c.user_data) * bs;
        if c.result != Ok(0) || bytes(c.data) != pattern(off, bs as usize, 11) {
            bad += 1;
        }
        if next < total {
            let buf = io.read(lba_of(next), b.alloc_buf(bs as usize).unwrap(), next);
            assert!(buf.is_ok());
            next += 1;
        }
    };
    assert!(ch.drain(&mut h, 1_000_000));
    assert_eq!(bad, 0, "every read returned its own block");
    assert_eq!(seen.len() as u64, total);
    assert!(seen.values().all(|&n| n == 1), "each completion once");
    assert_eq!(b.stats().reads, total);
}

#[test]
fn short_transfer_is_resubmitted_then_reported() {
    let f = temp("short", true);
    let b: Bdev = Bdev::uring("u9", &f.0, opts(true, 1 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let mut ch = chan(&b, 4);
    ch.write(0, filled(&b, 0, 1 << 20, 2), 1).unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
    // Something else shrinks the file: a read across the new end gets
    // the bytes up to it, then nothing.
    let eof = 512 << 10;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f.0)
        .unwrap()
        .set_len(eof)
        .unwrap();
    let start = eof - 16 * bs;
    ch.read(start / bs, b.alloc_buf(64 * bs as usize).unwrap(), 2)
        .unwrap();
    let c = one(&mut ch);
    assert_eq!(c.result, Err(IoError::Os(libc::ENODATA as u16)));
    assert_eq!(
        &bytes(c.data)[..16 * bs as usize],
        &pattern(start, 16 * bs as usize, 2)[..],
        "the bytes before the end arrived"
    );
    assert_eq!(b.stats().errors, 1);
}

#[test]
fn failed_backend_completes_every_outstanding_request() {
    let f = temp("fail", true);
    let b: Bdev = Bdev::uring("u10", &f.0, opts(true, 4 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let mut ch = chan(&b, 64);
    for i in 0..64 {
        ch.read(i, b.alloc_buf(bs as usize).unwrap(), i).unwrap();
    }
    ch.flush();
    assert!(b.inject_failure());
    let c = drain(&mut ch);
    assert_eq!(c.len(), 64, "none lost");
    assert!(c.iter().all(|c| c.result == Err(IoError::Failed)));
    assert!(c.iter().all(|c| c.data.len() == bs as usize));
    let r = ch
        .read(0, b.alloc_buf(bs as usize).unwrap(), 1)
        .unwrap_err();
    assert_eq!(r.error, SubmitError::Failed);
    assert_eq!(b.stats().errors, 64);
}

/// FS_IOC_SETFLAGS / FS_IOC_GETFLAGS and FS_IMMUTABLE_FL.
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IMMUTABLE_FL: libc::c_long = 0x10;

fn set_immutable(p: &Path, on: bool) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(p) else {
        return false;
    };
    let mut flags: libc::c_long = 0;
    // SAFETY: the ioctls read and write one long through the pointer.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut flags) != 0 {
            return false;
        }
        flags = if on {
            flags | FS_IMMUTABLE_FL
        } else {
            flags & !FS_IMMUTABLE_FL
        };
        libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &flags) == 0
    }
}

#[test]
fn kernel_errors_are_delivered_as_os_errors() {
    let f = temp("eperm", false);
    let b: Bdev = Bdev::uring("u11", &f.0, opts(false, 1 << 20)).unwrap();
    let bs = b.info().block_size as usize;
    let mut ch = chan(&b, 8);
    if !set_immutable(&f.0, true) {
        eprintln!(
            "skipped: cannot make {} immutable (not root?)",
            f.0.display()
        );
        return;
    }
    // An immutable file refuses fallocate and writes with EPERM.
    ch.write_zeroes(0, 4, 1).unwrap();
    ch.write(8, b.alloc_buf(bs).unwrap(), 2).unwrap();
    let mut c = drain(&mut ch);
    assert!(set_immutable(&f.0, false));
    c.sort_by_key(|c| c.user_data);
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].result, Err(IoError::os(libc::EPERM)), "{c:?}");
    assert_eq!(c[1].result, Err(IoError::os(libc::EPERM)), "{c:?}");
    assert_eq!(c[1].data.len(), bs, "the buffer comes back");
    assert_eq!(
        c[0].result.unwrap_err().to_string(),
        std::io::Error::from_raw_os_error(libc::EPERM).to_string()
    );
}

/// Memory that poisons itself and counts when it is freed.
struct Poisoned {
    freed: Arc<AtomicUsize>,
}

impl DmaRelease for Poisoned {
    fn release(&self, ptr: NonNull<u8>, len: usize, _iova: u64) {
        // SAFETY: the buffer's own mapping (made below), freed once.
        unsafe {
            std::ptr::write_bytes(ptr.as_ptr(), 0xEE, len);
            libc::munmap(ptr.as_ptr().cast(), len.next_multiple_of(4096));
        }
        self.freed.fetch_add(1, Ordering::SeqCst);
    }
}

fn poisoned(len: usize, fill: u8, freed: &Arc<AtomicUsize>) -> IoBuf {
    let m = pollux_bdev::mem::alloc_host(len).unwrap();
    let p = NonNull::new(m.as_ptr()).unwrap();
    std::mem::forget(m); // the mapping now belongs to Poisoned
                         // SAFETY: a fresh mapping of `len` bytes only this buffer reaches;
                         // Poisoned unmaps it.
    let mut b = IoBuf::new(unsafe {
        DmaBuffer::from_raw(
            p,
            len,
            Iova::Contiguous(p.as_ptr() as u64),
            Arc::new(Poisoned {
                freed: freed.clone(),
            }),
        )
    });
    b.as_mut_slice().fill(fill);
    b
}

#[test]
fn dropping_a_channel_waits_for_the_kernel_before_freeing_buffers() {
    let f = temp("drop", true);
    let b: Bdev = Bdev::uring("u12", &f.0, opts(true, 64 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let len = 1 << 20;
    let n = 64u64;
    let freed = Arc::new(AtomicUsize::new(0));
    let mut ch = chan(&b, 64);
    for i in 0..n {
        let off = i * len as u64;
        ch.write(off / bs, poisoned(len, 0x5A, &freed), i).unwrap();
    }
    ch.flush(); // in the kernel now
    assert_eq!(ch.outstanding(), n as usize);
    drop(ch);
    assert_eq!(
        freed.load(Ordering::SeqCst),
        n as usize,
        "every buffer freed by the drop"
    );
    // Had a buffer been poisoned before the kernel read it, the file
    // would hold 0xEE somewhere; it holds the data or (cancelled) zeroes.
    let got = file_bytes(&f.0, 0, (n as usize) * len);
    for (i, chunk) in got.chunks(len).enumerate() {
        assert!(
            chunk.iter().all(|&x| x == 0x5A) || chunk.iter().all(|&x| x == 0),
            "write {i} carried freed memory"
        );
    }
    // Reads in flight into buffers that are freed after the drop.
    let freed = Arc::new(AtomicUsize::new(0));
    let mut ch = chan(&b, 64);
    for i in 0..n {
        let off = i * len as u64;
        ch.read(off / bs, poisoned(len, 0, &freed), i).unwrap();
    }
    ch.flush();
    drop(ch);
    assert_eq!(freed.load(Ordering::SeqCst), n as usize);
    // And nothing in flight: a drop with nothing outstanding.
    drop(chan(&b, 4));
}

#[test]
fn two_channels_on_two_threads() {
    let f = temp("mt", true);
    let b: Bdev = Bdev::uring("u13", &f.0, opts(true, 8 << 20)).unwrap();
    let bs = b.info().block_size as u64;
    let half = b.info().num_blocks / 2;
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut ch = chan(&b, 32);
                let chunk = half * bs / 32;
                let base = t * half;
                let per = half * bs / chunk;
                for i in 0..per {
                    let off = base * bs + i * chunk;
                    ch.write(off / bs, filled(&b, off, chunk as usize, 100 + t), i)
                        .unwrap();
                }
                let c = drain(&mut ch);
                assert_eq!(c.len() as u64, per);
                assert!(c.iter().all(|c| c.result == Ok(0)));
                for i in 0..per {
                    let off = base * bs + i * chunk;
                    ch.read(off / bs, b.alloc_buf(chunk as usize).unwrap(), i)
                        .unwrap();
                }
                for c in drain(&mut ch) {
                    let off = base * bs + c.user_data * chunk;
                    assert!(bytes(c.data) == pattern(off, chunk as usize, 100 + t));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut ch = chan(&b, 4);
    let all = (2 * half * bs) as usize;
    ch.read(0, b.alloc_buf(all).unwrap(), 1).unwrap();
    let got = bytes(one(&mut ch).data);
    let h = (half * bs) as usize;
    assert!(got[..h] == pattern(0, h, 100)[..]);
    assert!(got[h..] == pattern(h as u64, h, 101)[..]);
}

#[test]
fn wake_fd_becomes_readable_on_completion() {
    use std::os::fd::AsRawFd;
    let f = temp("wake", true);
    let b: Bdev = Bdev::uring("u14", &f.0, opts(true, 1 << 20)).unwrap();
    let mut ch = chan(&b, 4);
    let fd = ch.wake_fd().expect("an eventfd").as_raw_fd();
    ch.read(0, b.alloc_buf(4096).unwrap(), 1).unwrap();
    ch.flush();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call.
    let n = unsafe { libc::poll(&mut p, 1, 10_000) };
    assert_eq!(n, 1, "the eventfd was signalled");
    assert_eq!(one(&mut ch).result, Ok(0));
    let o = UringOptions {
        wake_fd: false,
        ..opts(true, 1 << 20)
    };
    let b2: Bdev = Bdev::uring("u15", &f.0, o).unwrap();
    assert!(chan(&b2, 4).wake_fd().is_none());
    let ram: Bdev = Bdev::ram("r", 512, 8).unwrap();
    assert!(chan(&ram, 4).wake_fd().is_none());
}

#[test]
fn block_device_round_trip() {
    let Some(dev) = std::env::var_os("POLLUX_TEST_BLOCKDEV") else {
        eprintln!("skipped: set POLLUX_TEST_BLOCKDEV to a scratch block device");
        return;
    };
    let b: Bdev = Bdev::uring(
        "ublk",
        &dev,
        UringOptions {
            size: Some(16 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let name = Path::new(&dev)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let q = |attr: &str| -> u32 {
        let p = format!("/sys/class/block/{name}/queue/{attr}");
        std::fs::read_to_string(&p).unwrap().trim().parse().unwrap()
    };
    assert_eq!(b.info().block_size, q("logical_block_size"));
    assert_eq!(b.info().max_transfer, q("max_sectors_kb") * 1024);
    round_trip(&b, None);
    zeroing(&b, None);
}
