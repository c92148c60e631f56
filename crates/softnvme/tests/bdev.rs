//! Namespaces served by pollux-bdev: the emulator's namespace data is the
//! bdev's (one implementation, seen from both sides), PRP segments that are
//! not whole blocks, bdev failures as NVMe statuses, configuration checks.
mod common;

use common::*;
use pollux_bdev::{Bdev, ChannelOptions, Completion, Io};
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::log::{lid, SmartLog};
use pollux_spec::status::{generic, media, sct};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::{FromBytes, IntoBytes};

#[track_caller]
fn ok(st: Status) {
    assert!(st.is_success(), "got {st}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn one(ch: &mut pollux_bdev::Channel) -> Completion {
    let mut got = None;
    ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| got = Some(c));
    got.expect("the bdev completed the request")
}

/// Reads `len` bytes at `lba` through a channel of the test's own.
fn bdev_read(b: &Bdev, lba: u64, len: usize) -> Vec<u8> {
    let mut ch = b.open(false).channel(&ChannelOptions::default()).unwrap();
    ch.read(lba, b.alloc_buf(len).unwrap(), 1).unwrap();
    let c = one(&mut ch);
    assert_eq!(c.result, Ok(0));
    c.data.into_one().unwrap().as_slice().to_vec()
}

fn bdev_write(b: &Bdev, lba: u64, data: &[u8]) {
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let mut buf = b.alloc_buf(data.len()).unwrap();
    buf.as_mut_slice().copy_from_slice(data);
    ch.write(lba, buf, 1).unwrap();
    assert_eq!(one(&mut ch).result, Ok(0));
}

fn bdev_cfg(b: &Bdev) -> SoftConfig {
    SoftConfig {
        namespaces: vec![NamespaceConfig::bdev(b.clone())],
        ..Default::default()
    }
}

/// A PRP list page holding `entries`.
fn prp_list(h: &mut Host, entries: &[u64]) -> u64 {
    let (l, _) = h.alloc(4096);
    h.write_mem(l, entries.as_bytes());
    l
}

#[test]
fn emulator_data_is_the_bdevs_both_ways() {
    for bs in [512u32, 4096] {
        let b = Bdev::ram("shared", bs, 4096).unwrap();
        let mut h = Host::enabled(bdev_cfg(&b));
        let mut q = h.create_ioq(1, 16);
        let (buf, _) = h.alloc(8192);
        let nlb = 8192 / bs;

        // NVMe write -> the bdev's own channel reads it.
        let data = pattern(8192, bs as u8 ^ 1);
        h.write_mem(buf, &data);
        ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 10, nlb, buf, buf + 4096)));
        assert_eq!(bdev_read(&b, 10, 8192), data, "block size {bs}");

        // Bdev write -> NVMe read returns it.
        let data2 = pattern(8192, 0x5a);
        bdev_write(&b, 100, &data2);
        h.write_mem(buf, &[0xEE; 8192]);
        ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 100, nlb, buf, buf + 4096)));
        assert_eq!(h.read_mem(buf, 8192), data2, "block size {bs}");

        // Write Zeroes and deallocate reach the bdev.
        ok(h.io_status(&mut q, Sqe::write_zeroes(1, 10, 1, false)));
        let got = bdev_read(&b, 10, 2 * bs as usize);
        assert!(got[..bs as usize].iter().all(|&x| x == 0));
        assert_eq!(got[bs as usize..], data[bs as usize..2 * bs as usize]);
        let (rb, _) = h.alloc(4096);
        let range = DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 101,
        };
        h.write_mem(rb, range.as_bytes());
        ok(h.io_status(&mut q, Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, rb)));
        let got = bdev_read(&b, 100, 3 * bs as usize);
        assert_eq!(got[..bs as usize], data2[..bs as usize]);
        assert!(got[bs as usize..2 * bs as usize].iter().all(|&x| x == 0));
        ok(h.io_status(&mut q, Sqe::flush(1)));

        // The namespace is the whole bdev (size_bytes 0).
        ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 4095, 1, buf, 0)));
        let st = h.io_status(&mut q, rw(NvmOpcode::Read, 1, 4096, 1, buf, 0));
        assert!(st.is(sct::GENERIC, generic::LBA_OUT_OF_RANGE), "got {st}");

        // The emulator's requests are the bdev's: counted in its stats.
        let s = b.stats();
        assert_eq!(s.writes, 1 + 1, "one NVMe write, one of the test's");
        assert!(s.reads >= 3, "{s:?}");
        assert!(h.dev.namespace_bdev(1).is_some());
    }
}

#[test]
fn ram_and_null_namespaces_are_bdevs() {
    let h = Host::enabled(SoftConfig {
        namespaces: vec![
            ram_ns(9, 1 << 20),
            NamespaceConfig {
                backend: BackendConfig::Null,
                lba_shift: 12,
                size_bytes: 1 << 30,
            },
        ],
        ..Default::default()
    });
    let ram = h.dev.namespace_bdev(1).expect("namespace 1 is a bdev");
    let i = ram.info();
    assert_eq!(
        (i.name.as_str(), i.backend, i.block_size, i.num_blocks),
        ("SOFT0001n1", "ram", 512, 2048)
    );
    let null = h.dev.namespace_bdev(2).expect("namespace 2 is a bdev");
    let i = null.info();
    assert_eq!(
        (i.name.as_str(), i.backend, i.block_size, i.num_blocks),
        ("SOFT0001n2", "null", 4096, 1 << 18)
    );
    assert!(h.dev.namespace_bdev(0).is_none());
    assert!(h.dev.namespace_bdev(3).is_none());
    let mut h = h;
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(4096);
    let data = pattern(4096, 9);
    h.write_mem(buf, &data);
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 7, 8, buf, 0)));
    assert_eq!(bdev_read(&ram, 7, 4096), data);
}

/// Host memory of a transfer: `(iova, len)` pieces in order.
struct Scattered(Vec<(u64, usize)>);

impl Scattered {
    /// `len` bytes from `offset` into the first of every other page of a
    /// fresh region (so no two pages are adjacent and none merge into one
    /// segment); returns it with PRP1 and PRP2.
    fn new(h: &mut Host, offset: usize, len: usize) -> (Scattered, u64, u64) {
        let pages = (offset + len).div_ceil(4096);
        let (region, _) = h.alloc(pages * 2 * 4096);
        let page = |i: usize| region + (i * 2 * 4096) as u64;
        let mut v = vec![(page(0) + offset as u64, (4096 - offset).min(len))];
        let mut left = len - v[0].1;
        for i in 1..pages {
            v.push((page(i), left.min(4096)));
            left -= v[i].1;
        }
        let prp2 = match pages {
            1 => 0,
            2 => page(1),
            _ => prp_list(h, &(1..pages).map(page).collect::<Vec<_>>()),
        };
        (Scattered(v), page(0) + offset as u64, prp2)
    }

    fn write(&self, h: &Host, mut data: &[u8]) {
        for &(iova, len) in &self.0 {
            h.write_mem(iova, &data[..len]);
            data = &data[len..];
        }
    }

    fn read(&self, h: &Host) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|&(iova, len)| h.read_mem(iova, len))
            .collect()
    }
}

#[test]
fn segments_that_are_not_whole_blocks_go_through_the_bounce_buffer() {
    // 4 KiB blocks; data at a 512-byte offset: segments of 3584, 4096,
    // ..., 512 bytes.
    let b4 = Bdev::ram("b4k", 4096, 1024).unwrap();
    // 512-byte blocks; data at a 4-byte offset: segments of 4092 and 4.
    let b5 = Bdev::ram("b512", 512, 8192).unwrap();
    let mut h = Host::enabled(SoftConfig {
        namespaces: vec![
            NamespaceConfig::bdev(b4.clone()),
            NamespaceConfig::bdev(b5.clone()),
        ],
        ..Default::default()
    });
    let mut q = h.create_ioq(1, 16);

    // 128 KiB: two bounce chunks, 33 segments.
    let len = 128 << 10;
    let (w, w1, w2) = Scattered::new(&mut h, 512, len);
    assert_eq!((w.0.len(), w.0[0].1, w.0[32].1), (33, 3584, 512));
    let data = pattern(len, 3);
    w.write(&h, &data);
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 5, 32, w1, w2)));
    assert!(
        bdev_read(&b4, 5, len) == data,
        "write through the bounce buffer"
    );
    let (r, r1, r2) = Scattered::new(&mut h, 512, len);
    let data2 = pattern(len, 4);
    bdev_write(&b4, 200, &data2);
    h.write_mem(r1 - 512, &[0xCC; 512]);
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 200, 32, r1, r2)));
    assert!(r.read(&h) == data2, "read through the bounce buffer");
    assert!(
        h.read_mem(r1 - 512, 512).iter().all(|&x| x == 0xCC),
        "nothing written before the transfer"
    );

    // 4 KiB from a dword offset.
    let (w, w1, w2) = Scattered::new(&mut h, 4, 4096);
    assert_eq!((w.0.len(), w.0[0].1, w.0[1].1), (2, 4092, 4));
    let data = pattern(4096, 5);
    w.write(&h, &data);
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 2, 40, 8, w1, w2)));
    assert_eq!(bdev_read(&b5, 40, 4096), data);
    w.write(&h, &[0; 4096]);
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 2, 40, 8, w1, w2)));
    assert_eq!(w.read(&h), data);
}

#[test]
fn bdev_failures_are_nvme_media_and_internal_errors() {
    let b = Bdev::ram("failing", 512, 1024).unwrap();
    let mut h = Host::enabled(bdev_cfg(&b));
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(4096);
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 1, buf, 0)));
    assert!(b.inject_failure());
    h.write_mem(buf, &[0x42; 4096]);
    let st = h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, buf, 0));
    assert!(st.is(sct::MEDIA, media::UNRECOVERED_READ_ERROR), "{st}");
    assert!(h.read_mem(buf, 4096).iter().all(|&x| x == 0x42));
    let st = h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 1, buf, 0));
    assert!(st.is(sct::MEDIA, media::WRITE_FAULT), "{st}");
    let st = h.io_status(&mut q, Sqe::flush(1));
    assert!(st.is(sct::MEDIA, media::WRITE_FAULT), "{st}");
    let st = h.io_status(&mut q, Sqe::write_zeroes(1, 0, 1, false));
    assert!(st.is(sct::MEDIA, media::WRITE_FAULT), "{st}");
    let (rb, _) = h.alloc(4096);
    let range = DsmRange {
        cattr: 0,
        nlb: 1,
        slba: 0,
    };
    h.write_mem(rb, range.as_bytes());
    let st = h.io_status(&mut q, Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, rb));
    assert!(st.is(sct::GENERIC, generic::INTERNAL_ERROR), "{st}");
    // Each failure counts once in SMART's media errors (the DSM one is no
    // media error).
    let (lb, _) = h.alloc(512);
    ok(h.admin_status(Sqe::get_log_page(lid::SMART, 0, 512, 0, lb, 0)));
    let smart = SmartLog::read_from_bytes(&h.read_mem(lb, 512)).unwrap();
    assert_eq!(smart.media_errors(), 4);
}

#[test]
fn bad_bdev_namespaces_are_refused_by_name() {
    let err = |ns: NamespaceConfig| {
        SoftDevice::new(SoftConfig {
            namespaces: vec![ns],
            ..Default::default()
        })
        .unwrap_err()
        .to_string()
    };
    let b = Bdev::ram("small", 512, 64).unwrap();
    let e = err(NamespaceConfig {
        lba_shift: 12,
        ..NamespaceConfig::bdev(b.clone())
    });
    assert!(
        e.contains("namespace 1") && e.contains("bdev small has 512-byte blocks"),
        "{e}"
    );
    let e = err(NamespaceConfig {
        size_bytes: 64 * 512 + 512,
        ..NamespaceConfig::bdev(b.clone())
    });
    assert!(e.contains("exceeds bdev small"), "{e}");
    let odd = Bdev::ram("odd", 1024, 64).unwrap();
    let e = err(NamespaceConfig::bdev(odd));
    assert!(e.contains("bdev odd") && e.contains("not 9 or 12"), "{e}");

    // A namespace smaller than its bdev is the bdev's first blocks.
    let mut h = Host::enabled(SoftConfig {
        namespaces: vec![NamespaceConfig {
            size_bytes: 16 * 512,
            ..NamespaceConfig::bdev(b.clone())
        }],
        ..Default::default()
    });
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(4096);
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 15, 1, buf, 0)));
    let st = h.io_status(&mut q, rw(NvmOpcode::Read, 1, 16, 1, buf, 0));
    assert!(st.is(sct::GENERIC, generic::LBA_OUT_OF_RANGE), "{st}");
}
