use std::path::PathBuf;
use std::sync::Arc;

use pollux_nvme::IoBuf;

use super::options::NO_BUF;
use super::pool::{give, lock, take, Pool, REGION_MIN};
use super::UringOptions;
use crate::channel::ChanBe;
use crate::{Bdev, ChannelOptions};

struct Temp(PathBuf);
impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn bdev(tag: &str, register_buffers: bool) -> (Temp, Bdev) {
    let p = std::env::temp_dir().join(format!("pollux-uring-unit-{}-{tag}", std::process::id()));
    std::fs::File::create(&p).unwrap();
    let o = UringOptions {
        direct: false,
        size: Some(1 << 20),
        register_buffers,
        ..Default::default()
    };
    let b = Bdev::uring("t", &p, o).unwrap();
    (Temp(p), b)
}

fn addr(b: &mut IoBuf) -> u64 {
    b.as_mut_slice().as_mut_ptr() as u64
}

#[test]
fn pool_buffers_are_found_in_registered_regions() {
    let (_t, b) = bdev("fixed", true);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let ChanBe::Uring(u) = &mut ch.be else {
        panic!("not a uring channel")
    };
    let mut x = b.alloc_buf(8192).unwrap();
    assert_eq!(u.buf_index(addr(&mut x), 8192), 0, "first region");
    // A piece of it too.
    let (_, mut tail) = x.split_at(4096);
    assert_eq!(u.buf_index(addr(&mut tail), 4096), 0);
    // Beyond the first region's 4 MiB: a second region, registered
    // when first seen.
    let mut big = b.alloc_buf(5 << 20).unwrap();
    assert_eq!(u.buf_index(addr(&mut big), 5 << 20), 1);
    assert_eq!(u.known.len(), 2);
    // Memory of no region goes plain.
    let mut plain = crate::mem::alloc_host_buf(4096).unwrap();
    assert_eq!(u.buf_index(addr(&mut plain), 4096), NO_BUF);
    // A range running past its region's end is not in it.
    let (start, end) = b_pool(&b).span(0);
    assert!(u.buf_index(end - 4096, 8192) == NO_BUF && end - start == REGION_MIN as u64);
}

fn b_pool(b: &Bdev) -> Arc<Pool> {
    match &b.0.backend {
        crate::bdev::Shared::Uring(u) => u.pool.clone().unwrap(),
        _ => panic!("not uring"),
    }
}

#[test]
fn without_registration_nothing_is_fixed() {
    let (_t, b) = bdev("plain", false);
    let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
    let ChanBe::Uring(u) = &mut ch.be else {
        panic!("not a uring channel")
    };
    let mut x = b.alloc_buf(8192).unwrap();
    assert_eq!(u.buf_index(addr(&mut x), 8192), NO_BUF);
}

#[test]
fn pool_memory_is_reused_zeroed_and_coalesced() {
    let (_t, b) = bdev("pool", true);
    let mut x = b.alloc_buf(4096).unwrap();
    let a = addr(&mut x);
    x.as_mut_slice().fill(7);
    drop(x);
    let mut y = b.alloc_buf(4096).unwrap();
    assert_eq!(addr(&mut y), a, "the freed range is reused");
    assert!(y.as_slice().iter().all(|&v| v == 0), "and zeroed");
    drop(y);
    // Three neighbours freed out of order merge back into one range:
    // the whole region is then one free range again.
    let bufs: Vec<IoBuf> = (0..3).map(|_| b.alloc_buf(4096).unwrap()).collect();
    let mut it = bufs.into_iter();
    let (p, q, r) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    drop(q);
    drop(p);
    drop(r);
    let pool = b_pool(&b);
    let g = lock(&pool.inner);
    assert_eq!(g.free[0], vec![(0, REGION_MIN)]);
}

#[test]
fn free_list_first_fit_and_merge() {
    let mut f = vec![(0, 100)];
    assert_eq!(take(&mut f, 30), Some(0));
    assert_eq!(take(&mut f, 30), Some(30));
    assert_eq!(take(&mut f, 50), None);
    give(&mut f, 0, 30);
    assert_eq!(f, vec![(0, 30), (60, 40)]);
    give(&mut f, 30, 30);
    assert_eq!(f, vec![(0, 100)]);
}
