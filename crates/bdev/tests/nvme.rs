//! The NVMe backend over the emulated controller (inline: deterministic).
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::{
    Bdev, Channel, ChannelOptions, Completion, Data, Io, IoBuf, IoError, SubmitError,
};
use pollux_host::{ControllerOptions, QpairOptions};
use pollux_softnvme::{
    BackendConfig, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig, SoftDevice,
};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::{NvmOpcode, Sqe};

type B = Bdev;
type Ch = Channel;

fn open(
    backend: BackendConfig,
    size: u64,
    mdts: u8,
    timeout: Option<Duration>,
) -> (Arc<SoftDevice>, B) {
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend,
            lba_shift: 9,
            size_bytes: size,
        }],
        mdts,
        ..SoftConfig::default()
    })
    .unwrap();
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions {
            admin_timeout: Duration::from_millis(500),
            ..ControllerOptions::default()
        },
    )
    .unwrap();
    let q = QpairOptions {
        timeout,
        ..QpairOptions::default()
    };
    (
        dev,
        Bdev::nvme("nvme0n1", Arc::new(ctrl.into()), 1, q).unwrap(),
    )
}

fn pattern(b: &B, len: usize, seed: u64) -> IoBuf {
    let mut buf = b.alloc_buf(len).unwrap().truncate(len);
    for (i, x) in buf.as_mut_slice().chunks_exact_mut(8).enumerate() {
        x.copy_from_slice(&(seed * 1_000_003 + i as u64).to_le_bytes());
    }
    buf
}

fn drain(ch: &mut Ch) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut h = |_: &mut Io<'_>, c: Completion| out.push(c);
    assert!(ch.drain(&mut h, 10_000_000), "channel did not drain");
    out.sort_by_key(|c| c.user_data);
    out
}

fn bytes(d: Data) -> Vec<u8> {
    d.into_vec()
        .iter()
        .flat_map(|b| b.as_slice().to_vec())
        .collect()
}

#[test]
fn data_round_trips_through_one_buffer_vectors_and_splits() {
    // MDTS 1: 8 KiB per command, so 64 KiB is split by the queue pair.
    let (_dev, b) = open(BackendConfig::Ram, 4 << 20, 1, None);
    let info = b.info().clone();
    assert_eq!(
        (info.block_size, info.num_blocks, info.backend),
        (512, 8192, "nvme")
    );
    assert!(info.caps.nvme_passthru);
    // NVMe takes only its own DMA memory: callers stage borrowed memory.
    assert!(!info.caps.host_memory);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let w = pattern(&b, 64 << 10, 1);
    let expect = w.as_slice().to_vec();
    ch.write(100, w, 1).unwrap();
    // A vector of three pieces of different allocations, 24 KiB.
    let v = vec![
        pattern(&b, 4096, 2),
        pattern(&b, 16384, 3),
        pattern(&b, 4096, 4),
    ];
    let expect_v: Vec<u8> = v.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    ch.writev(1000, v, 2).unwrap();
    let c = drain(&mut ch);
    assert_eq!(c.len(), 2, "a split request completes once");
    assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
    assert!(matches!(c[1].data, Data::Vec(ref v) if v.len() == 3));

    ch.read(100, b.alloc_buf(64 << 10).unwrap(), 3).unwrap();
    let (x, y) = b.alloc_buf(24 << 10).unwrap().split_at(8192);
    ch.readv(1000, vec![x, y], 4).unwrap();
    let mut c = drain(&mut ch);
    assert_eq!(bytes(std::mem::take(&mut c[0].data)), expect);
    assert_eq!(bytes(std::mem::take(&mut c[1].data)), expect_v);

    // Write zeroes, unmap (RAM deallocates to zeroes), flush.
    ch.write_zeroes(100, 8, 5).unwrap();
    ch.unmap(1008, 8, 6).unwrap();
    ch.flush_cache(7).unwrap();
    assert!(drain(&mut ch).iter().all(|c| c.result.is_ok()));
    ch.read(100, b.alloc_buf(8192).unwrap(), 8).unwrap();
    ch.read(1000, b.alloc_buf(8192).unwrap(), 9).unwrap();
    let mut c = drain(&mut ch);
    let z = bytes(std::mem::take(&mut c[0].data));
    assert!(z[..4096].iter().all(|&x| x == 0));
    assert_eq!(&z[4096..], &expect[4096..8192]);
    let z = bytes(std::mem::take(&mut c[1].data));
    assert_eq!(&z[..4096], &expect_v[..4096]);
    assert!(z[4096..].iter().all(|&x| x == 0));

    let s = b.stats();
    assert_eq!((s.writes, s.reads, s.errors), (2, 4, 0));
    assert_eq!(s.write_bytes, (64 + 24) << 10);
}

#[test]
fn passthrough_reaches_the_controller() {
    let (_dev, b) = open(BackendConfig::Ram, 1 << 20, 5, None);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let w = pattern(&b, 4096, 9);
    let expect = w.as_slice().to_vec();
    ch.write(8, w, 1).unwrap();
    drain(&mut ch);
    let sqe = Sqe {
        opc: NvmOpcode::Read as u8,
        nsid: 1,
        cdw10: 8,
        cdw12: 7, // 8 blocks, 0's based
        ..Sqe::default()
    };
    ch.nvme_passthru(sqe, Some(b.alloc_buf(4096).unwrap()), 2)
        .unwrap();
    let mut c = drain(&mut ch);
    assert_eq!(c[0].result, Ok(0));
    assert_eq!(bytes(std::mem::take(&mut c[0].data)), expect);
}

#[test]
fn large_zeroing_is_split_below_the_command_limit() {
    // 200,000 blocks need 4 Write Zeroes / deallocate commands.
    let (dev, b) = open(BackendConfig::Null, 200_000 * 512, 5, None);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    ch.write_zeroes(0, 200_000, 1).unwrap();
    ch.unmap(0, 200_000, 2).unwrap();
    let c = drain(&mut ch);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
    let _ = dev;
    assert_eq!(b.stats().others, 2);
}

#[test]
fn bad_requests_are_refused_in_the_layers_terms() {
    let (_dev, b) = open(BackendConfig::Ram, 1 << 20, 5, None);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let r = ch.read(2047, b.alloc_buf(1024).unwrap(), 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::OutOfRange {
            lba: 2047,
            nlb: 2,
            num_blocks: 2048
        }
    );
    assert_eq!(r.data.len(), 1024, "the buffer comes back");
    let r = ch
        .write(0, b.alloc_buf(4096).unwrap().truncate(700), 1)
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            SubmitError::NotBlockMultiple {
                len: 700,
                block_size: 512
            }
        ),
        "{r:?}"
    );
    let r = ch
        .readv(
            2040,
            vec![b.alloc_buf(4096).unwrap(), b.alloc_buf(512).unwrap()],
            1,
        )
        .unwrap_err();
    assert!(matches!(
        r.error,
        SubmitError::OutOfRange {
            lba: 2040,
            nlb: 9,
            ..
        }
    ));
    assert!(matches!(r.data, Data::Vec(ref v) if v.len() == 2));
    let mut raw = [0u8; 512];
    let seg = pollux_bdev::RawSeg {
        ptr: raw.as_mut_ptr(),
        len: raw.len(),
    };
    // SAFETY: refused before anything touches the segment.
    let e = unsafe { ch.io().readv_raw(0, &[seg], 1) }.unwrap_err();
    assert!(matches!(
        e,
        SubmitError::Unsupported {
            backend: "nvme",
            ..
        }
    ));
    assert_eq!(
        ch.write_zeroes(2000, 100, 1),
        Err(SubmitError::OutOfRange {
            lba: 2000,
            nlb: 100,
            num_blocks: 2048
        })
    );
    assert!(drain(&mut ch).is_empty());
}

#[test]
fn a_failing_controller_completes_every_outstanding_request() {
    // Reads of blocks 0..64 never complete; the queue pair times them out,
    // aborts, then resets the controller.
    let (dev, b) = open(
        BackendConfig::Ram,
        1 << 20,
        5,
        Some(Duration::from_millis(20)),
    );
    dev.add_fault(FaultRule {
        queue: QueueSel::Io,
        opcode: Some(NvmOpcode::Read as u8),
        nsid: None,
        lba: Some(0..64),
        skip: 0,
        count: None,
        action: FaultAction::Drop,
    });
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    for i in 0..96u64 {
        ch.read(i, b.alloc_buf(512).unwrap(), i).unwrap();
    }
    let mut c = Vec::new();
    let t0 = std::time::Instant::now();
    while c.len() < 96 && t0.elapsed() < Duration::from_secs(30) {
        ch.poll(u32::MAX, &mut |_: &mut Io<'_>, x: Completion| c.push(x));
        dev.step();
    }
    dev.clear_faults();
    c.sort_by_key(|c| c.user_data);
    assert_eq!(c.len(), 96, "none lost");
    assert_eq!(
        c.iter().map(|c| c.user_data).collect::<Vec<_>>(),
        (0..96).collect::<Vec<_>>()
    );
    for x in &c {
        assert!(matches!(x.data, Data::One(_)), "buffer handed back");
        if x.user_data < 64 {
            assert!(
                matches!(
                    x.result,
                    Err(IoError::Timeout | IoError::ControllerReset | IoError::Nvme(_))
                ),
                "{x:?}"
            );
        } else {
            assert_eq!(x.result, Ok(0));
        }
    }
    assert_eq!(b.stats().errors, 64);
}

#[test]
fn a_vector_refused_at_its_first_buffer_comes_back_whole_and_leaves_nothing_open() {
    let (_dev, b) = open(BackendConfig::Ram, 1 << 20, 5, None);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    // The first buffer starts 2 bytes into its allocation: the driver
    // refuses it (PRP entries need dword alignment).
    let (_, odd) = b.alloc_buf(1026).unwrap().split_at(2);
    let r = ch
        .readv(0, vec![odd, b.alloc_buf(512).unwrap()], 7)
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            SubmitError::Nvme(pollux_nvme::SubmitError::Unaligned { .. })
        ),
        "{r:?}"
    );
    assert!(matches!(r.data, Data::Vec(ref v) if v.len() == 2 && v[0].len() == 1024));
    assert_eq!(ch.outstanding(), 0, "no parent left open");
    assert!(drain(&mut ch).is_empty());
    // Zeroing within one command's reach goes out without a parent.
    ch.unmap(0, 2048, 8).unwrap();
    assert_eq!(drain(&mut ch).len(), 1);
    assert_eq!(ch.outstanding(), 0);
}

/// The NVMe completion has two routes: a one-buffer request with no split
/// child or latency slot (built as `Data::One` in the hot path), and the
/// rest (latency slots, split children, commands without a buffer). Both
/// must hand back the caller's user data and buffers, and count errors.
#[test]
fn completions_keep_user_data_and_buffers_on_every_route() {
    let (_dev, b) = open(BackendConfig::Ram, 4 << 20, 1, None);
    for latency in [false, true] {
        let opts = ChannelOptions {
            latency,
            ..Default::default()
        };
        let mut ch = b.open(true).channel(&opts).unwrap();
        let base = if latency { 1000 } else { 0 };
        ch.write(8, pattern(&b, 4096, 5), base + 1).unwrap();
        // 32 KiB at MDTS 8 KiB: split by the queue pair into four commands.
        ch.write(64, pattern(&b, 32768, 6), base + 2).unwrap();
        // A vector: split by the layer (children carry the layer's tag).
        let v = vec![pattern(&b, 4096, 7), pattern(&b, 4096, 8)];
        ch.writev(200, v, base + 3).unwrap();
        ch.flush_cache(base + 4).unwrap();
        let c = drain(&mut ch);
        let uds: Vec<u64> = c.iter().map(|c| c.user_data).collect();
        assert_eq!(uds, (1..=4).map(|i| base + i).collect::<Vec<_>>());
        assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
        assert!(matches!(c[0].data, Data::One(ref b) if b.len() == 4096));
        assert!(matches!(c[1].data, Data::One(ref b) if b.len() == 32768));
        assert!(matches!(c[2].data, Data::Vec(ref v) if v.len() == 2));
        assert!(matches!(c[3].data, Data::None));

        ch.read(8, b.alloc_buf(4096).unwrap(), base + 5).unwrap();
        // Past the end of the namespace: refused at submission, buffer back.
        let r = ch
            .read(8191, b.alloc_buf(4096).unwrap(), base + 6)
            .unwrap_err();
        assert!(matches!(r.data, Data::One(_)), "{r:?}");
        let mut c = drain(&mut ch);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].user_data, base + 5);
        assert_eq!(
            bytes(std::mem::take(&mut c[0].data)),
            pattern(&b, 4096, 5).as_slice()
        );
    }
    let s = b.stats();
    assert_eq!((s.writes, s.reads, s.others), (6, 2, 2));
    let lat = s.latency.expect("the latency channel merged its histogram");
    assert_eq!(lat.count, 5, "every request of the latency channel");
}
