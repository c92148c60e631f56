//! Null and RAM backends: data, vectors, bad requests, failure, stats.
use pollux_bdev::{Bdev, ChannelOptions, Completion, Data, Io, IoError, SubmitError};

type B = Bdev;

fn ram(blocks: u64) -> B {
    Bdev::ram("ram0", 512, blocks).unwrap()
}

fn fill(b: &B, len: usize, seed: u8) -> pollux_bdev::IoBuf {
    let mut buf = b.alloc_buf(len).unwrap();
    for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
        *x = seed.wrapping_add((i / 7) as u8);
    }
    buf
}

fn poll_all(ch: &mut pollux_bdev::Channel) -> Vec<Completion> {
    let mut out = Vec::new();
    ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| out.push(c));
    out
}

#[test]
fn ram_round_trip_one_buffer_and_vector() {
    let b = ram(64);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let w = fill(&b, 4096, 3);
    let expect = w.as_slice().to_vec();
    ch.write(8, w, 1).unwrap();
    let c = poll_all(&mut ch);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].user_data, 1);
    assert_eq!(c[0].result, Ok(0));
    // Read it back as a vector of 1 KiB + 3 KiB.
    let (a, z) = b.alloc_buf(4096).unwrap().split_at(1024);
    ch.readv(8, vec![a, z], 2).unwrap();
    let c = poll_all(&mut ch).pop().unwrap();
    assert_eq!(c.result, Ok(0));
    let got: Vec<u8> = c
        .data
        .into_vec()
        .iter()
        .flat_map(|b| b.as_slice().to_vec())
        .collect();
    assert_eq!(got, expect);
    // Unmap zeroes.
    ch.unmap(9, 2, 3).unwrap();
    poll_all(&mut ch);
    ch.read(8, b.alloc_buf(2048).unwrap(), 4).unwrap();
    let c = poll_all(&mut ch).pop().unwrap();
    let got = c.data.into_one().unwrap();
    assert_eq!(&got.as_slice()[..512], &expect[..512]);
    assert!(got.as_slice()[512..1536].iter().all(|&x| x == 0));
    assert_eq!(&got.as_slice()[1536..], &expect[1536..2048]);
}

#[test]
fn bad_requests_are_refused_by_name_and_hand_back_the_buffer() {
    let b = ram(16);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let r = ch.read(15, b.alloc_buf(1024).unwrap(), 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::OutOfRange {
            lba: 15,
            nlb: 2,
            num_blocks: 16
        }
    );
    assert_eq!(r.data.len(), 1024);
    let r = ch.write(0, b.alloc_buf(100).unwrap(), 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::NotBlockMultiple {
            len: 100,
            block_size: 512
        }
    );
    let r = ch.read(0, b.alloc_buf(0).unwrap(), 1).unwrap_err();
    assert_eq!(r.error, SubmitError::ZeroLength);
    let r = ch.read(0, b.alloc_buf(512).unwrap(), 1 << 63).unwrap_err();
    assert_eq!(r.error, SubmitError::ReservedUserData(1 << 63));
    let mut ro = b.open(false).channel(&ChannelOptions::default()).unwrap();
    let r = ro.write(0, b.alloc_buf(512).unwrap(), 1).unwrap_err();
    assert_eq!(r.error, SubmitError::ReadOnly);
    assert_eq!(ro.unmap(0, 1, 1), Err(SubmitError::ReadOnly));
    let r = ch
        .nvme_passthru(pollux_spec::Sqe::default(), None, 1)
        .unwrap_err();
    assert!(matches!(
        r.error,
        SubmitError::Unsupported { backend: "ram", .. }
    ));
    assert!(poll_all(&mut ch).is_empty());
    assert_eq!(b.stats().reads + b.stats().writes, 0);
}

#[test]
fn channel_depth_is_a_limit() {
    let b: B = Bdev::null("null0", 512, 1 << 20).unwrap();
    let mut ch = b
        .open(false)
        .channel(&ChannelOptions {
            depth: 4,
            ..Default::default()
        })
        .unwrap();
    for i in 0..4 {
        ch.read(i, b.alloc_buf(512).unwrap(), i).unwrap();
    }
    let r = ch.read(4, b.alloc_buf(512).unwrap(), 4).unwrap_err();
    assert_eq!(r.error, SubmitError::QueueFull { depth: 4 });
    assert_eq!(poll_all(&mut ch).len(), 4);
}

#[test]
fn failed_backend_fails_every_outstanding_request() {
    let b = ram(1024);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    for i in 0..50 {
        ch.read(i, b.alloc_buf(512).unwrap(), i).unwrap();
    }
    assert!(b.inject_failure());
    let c = poll_all(&mut ch);
    assert_eq!(c.len(), 50, "none lost");
    assert!(c.iter().all(|c| c.result == Err(IoError::Failed)));
    assert!(c.iter().all(|c| matches!(c.data, Data::One(_))));
    let r = ch.read(0, b.alloc_buf(512).unwrap(), 1).unwrap_err();
    assert_eq!(r.error, SubmitError::Failed);
    assert_eq!(b.stats().errors, 50);
}

#[test]
fn stats_and_latency_across_channels_and_threads() {
    let b: B = Bdev::null("null1", 4096, 1 << 20).unwrap();
    let d = b.open(true);
    let opts = ChannelOptions {
        latency: true,
        ..Default::default()
    };
    let mut ch = d.channel(&opts).unwrap();
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        let mut ch = b2.open(true).channel(&ChannelOptions::default()).unwrap();
        for i in 0..10 {
            ch.write(i, b2.alloc_buf(8192).unwrap(), i).unwrap();
            poll_all(&mut ch);
        }
    });
    let mut seen = Vec::new();
    for i in 0..100 {
        ch.read(i, b.alloc_buf(4096).unwrap(), 1000 + i).unwrap();
        seen.extend(poll_all(&mut ch).into_iter().map(|c| c.user_data));
    }
    t.join().unwrap();
    assert_eq!(
        seen,
        (1000..1100).collect::<Vec<_>>(),
        "user data survives latency slots"
    );
    let s = b.stats();
    assert_eq!((s.reads, s.read_bytes), (100, 100 * 4096));
    assert_eq!((s.writes, s.write_bytes), (10, 10 * 8192));
    drop(ch);
    let lat = b
        .stats()
        .latency
        .expect("latency merged when the channel closed");
    assert_eq!(lat.count, 100);
}

#[test]
fn borrowed_memory_now_finishes_within_the_call_and_queues_nothing() {
    let b = ram(64);
    assert!(b.info().caps.host_memory);
    assert!(B::null("n", 512, 8).unwrap().info().caps.host_memory);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let mut src = vec![7u8; 1024];
    let mut dst = vec![0u8; 1024];
    let seg = |v: &mut Vec<u8>| pollux_bdev::RawSeg {
        ptr: v.as_mut_ptr(),
        len: v.len(),
    };
    // SAFETY: the vectors outlive the calls and nothing else touches them.
    unsafe {
        assert_eq!(ch.writev_raw_now(4, &[seg(&mut src)]), Some(Ok(())));
        assert_eq!(ch.readv_raw_now(4, &[seg(&mut dst)]), Some(Ok(())));
        assert_eq!(
            ch.readv_raw_now(63, &[seg(&mut dst)]),
            Some(Err(SubmitError::OutOfRange {
                lba: 63,
                nlb: 2,
                num_blocks: 64
            }))
        );
    }
    assert_eq!(dst, src);
    // Counted and visible at once: no poll follows such a request.
    let s = b.stats();
    assert_eq!((s.reads, s.writes, s.read_bytes, s.errors), (1, 1, 1024, 0));
    assert!(poll_all(&mut ch).is_empty(), "no completion follows");
    b.inject_failure();
    // SAFETY: as above.
    let r = unsafe { ch.readv_raw_now(4, &[seg(&mut dst)]) };
    assert_eq!(r, Some(Err(SubmitError::Failed)));
}

#[test]
fn unmap_of_whole_pages_and_ragged_ends_zeroes_exactly_the_range() {
    let b = ram(64); // 32 KiB, 512-byte blocks
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let w = fill(&b, 32768, 9);
    let expect = w.as_slice().to_vec();
    ch.write(0, w, 1).unwrap();
    // Blocks 3..45: bytes 1536..23040, three whole pages (4096..16384..)
    // between two ragged ends.
    ch.unmap(3, 42, 2).unwrap();
    ch.write_zeroes(60, 2, 3).unwrap();
    poll_all(&mut ch);
    ch.read(0, b.alloc_buf(32768).unwrap(), 4).unwrap();
    let got = poll_all(&mut ch).pop().unwrap().data.into_one().unwrap();
    let got = got.as_slice();
    assert_eq!(&got[..1536], &expect[..1536]);
    assert!(got[1536..23040].iter().all(|&x| x == 0));
    assert_eq!(&got[23040..30720], &expect[23040..30720]);
    assert!(got[30720..31744].iter().all(|&x| x == 0));
    assert_eq!(&got[31744..], &expect[31744..]);
}
