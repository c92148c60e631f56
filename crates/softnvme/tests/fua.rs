//! Force Unit Access on the emulated controller, from hand-made SQEs
//! (independent of the driver's encoding): a Write with CDW12 bit 30 set
//! is durable when its completion is posted; without it, it is durable
//! only after a Flush; while the volatile write cache is disabled (Set
//! Features Volatile Write Cache, WCE = 0, until a controller reset),
//! every write is. The namespace is a RAM disk with a simulated volatile
//! write cache (`lose_volatile_cache` drops what is not durable).
mod common;

use common::*;
use pollux_bdev::Bdev;
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig};
use pollux_spec::features::fid;
use pollux_spec::{NvmOpcode, Sqe, Status};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i * 7 % 251) as u8).collect()
}

/// CDW12 bit 30.
const FUA: u32 = 1 << 30;

#[test]
fn fua_write_is_durable_when_completed() {
    let bdev = Bdev::ram_with_volatile_cache("c0", 512, 2048).unwrap();
    let mut h = Host::enabled(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Bdev(bdev.clone()),
            lba_shift: 9,
            size_bytes: 2048 * 512,
        }],
        ..Default::default()
    });
    let mut q = h.create_ioq(1, 16);
    let (w, _) = h.alloc(8192);
    let (r, _) = h.alloc(8192);
    let ok = |st: Status| assert!(st.is_success(), "{st}");
    // FUA, 8 KiB (PRP1 + PRP2), then a plain 4 KiB write.
    h.write_mem(w, &pattern(8192, 1));
    let mut s = rw(NvmOpcode::Write, 1, 0, 16, w, w + 4096);
    s.cdw12 |= FUA;
    ok(h.io_status(&mut q, s));
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "durable when completed"
    );
    h.write_mem(w, &pattern(4096, 2));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 100, 8, w, 0)));
    assert_eq!(bdev.lose_volatile_cache(), Some(8), "a plain write is not");
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 16, r, r + 4096)));
    assert_eq!(h.read_mem(r, 8192), pattern(8192, 1));
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 100, 8, r, 0)));
    assert!(h.read_mem(r, 4096).iter().all(|&x| x == 0));
    // A plain write, then Flush: durable.
    h.write_mem(w, &pattern(4096, 3));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 200, 8, w, 0)));
    ok(h.io_status(&mut q, Sqe::flush(1)));
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
    // A plain write, then a FUA read of it: committed by the read.
    h.write_mem(w, &pattern(4096, 4));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 300, 8, w, 0)));
    let mut s = rw(NvmOpcode::Read, 1, 300, 8, r, 0);
    s.cdw12 |= FUA;
    ok(h.io_status(&mut q, s));
    assert_eq!(h.read_mem(r, 4096), pattern(4096, 4));
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
}

/// Get Features Volatile Write Cache (current): DW0.
fn wce(h: &mut Host) -> u32 {
    let c = h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0));
    assert!(c.status().is_success(), "{}", c.status());
    c.dw0
}

#[test]
fn write_cache_disabled_makes_plain_writes_durable_when_completed() {
    let bdev = Bdev::ram_with_volatile_cache("c0", 512, 2048).unwrap();
    let mut h = Host::enabled(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Bdev(bdev.clone()),
            lba_shift: 9,
            size_bytes: 2048 * 512,
        }],
        ..Default::default()
    });
    let mut q = h.create_ioq(1, 16);
    let (w, _) = h.alloc(8192);
    let (r, _) = h.alloc(8192);
    let ok = |st: Status| assert!(st.is_success(), "{st}");
    assert_eq!(wce(&mut h), 1, "enabled by default");
    // WCE = 1: a plain write is lost.
    h.write_mem(w, &pattern(4096, 1));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 8, w, 0)));
    assert_eq!(bdev.lose_volatile_cache(), Some(8));
    // WCE = 0: plain writes (one page, two pages) and a write zeroes
    // are durable when completed.
    ok(h.admin_status(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0, 0)));
    assert_eq!(wce(&mut h), 0);
    h.write_mem(w, &pattern(8192, 2));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 16, w, w + 4096)));
    h.write_mem(w, &pattern(4096, 3));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 100, 8, w, 0)));
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "a completed write was lost"
    );
    ok(h.io_status(&mut q, Sqe::write_zeroes(1, 4, 4, false)));
    assert_eq!(bdev.lose_volatile_cache(), Some(0), "write zeroes lost");
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 16, r, r + 4096)));
    let mut want = pattern(8192, 2);
    want[2048..4096].fill(0);
    assert_eq!(h.read_mem(r, 8192), want);
    ok(h.io_status(&mut q, rw(NvmOpcode::Read, 1, 100, 8, r, 0)));
    assert_eq!(h.read_mem(r, 4096), pattern(4096, 3));
    // A controller reset (CC.EN 1 -> 0) enables the cache again.
    h.set_enable(false);
    let c = h.set_enable(true);
    assert!(c.rdy() && !c.cfs(), "{c:?}");
    assert_eq!(wce(&mut h), 1, "reset to the default");
    let mut q = h.create_ioq(1, 16);
    h.write_mem(w, &pattern(4096, 4));
    ok(h.io_status(&mut q, rw(NvmOpcode::Write, 1, 200, 8, w, 0)));
    assert_eq!(bdev.lose_volatile_cache(), Some(8));
}
