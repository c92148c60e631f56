//! The host transport against the scripted controller in `common`.
mod common;

use std::time::{Duration, Instant};

use common::{Fake, Script, HOSTNQN, NSZE, SUBNQN};
use pollux_nvme::{Completion, ControllerOptions, IoBuf, IoError, QpairOptions};
use pollux_spec::tcp::Digests;
use pollux_tcp::{Controller, QueuePair, TcpOptions};

fn opts(fake: &Fake, digests: Digests) -> TcpOptions {
    let mut o = TcpOptions::new(fake.addr, SUBNQN);
    o.hostnqn = HOSTNQN.into();
    o.digests = digests;
    o.kato_ms = 0;
    o.ctrl_loss_tmo = Some(Duration::from_millis(500));
    o.reconnect_delay = Duration::from_millis(100);
    o
}

fn open(fake: &Fake, digests: Digests) -> Controller {
    pollux_tcp::open(opts(fake, digests), ControllerOptions::default()).expect("bring-up")
}

fn qpair(c: &Controller, depth: u16) -> QueuePair {
    c.alloc_qpair(QpairOptions {
        depth,
        timeout: None,
        ..QpairOptions::default()
    })
    .expect("queue pair")
}

/// Polls until `n` completions arrived (hang guard: 20 s, not a timing
/// assertion).
fn wait(qp: &mut QueuePair, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let start = Instant::now();
    while got.len() < n {
        qp.poll(u32::MAX, |_, c| got.push(c));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {} of {n} completions",
            got.len()
        );
        std::thread::yield_now();
    }
    got
}

fn fill(bytes: &mut [u8], seed: u8) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = seed.wrapping_add((i * 7 % 251) as u8);
    }
}

fn pattern(buf: &mut IoBuf, seed: u8) {
    fill(buf.as_mut_slice(), seed)
}

fn expected(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(&mut v, seed);
    v
}

fn write(qp: &mut QueuePair, c: &Controller, lba: u64, len: usize, seed: u8) {
    let ns = c.namespaces()[0];
    let mut b = IoBuf::new(c.alloc_dma(len).unwrap());
    pattern(&mut b, seed);
    qp.write(&ns, lba, (len / 512) as u32, b, 1).unwrap();
    let r = wait(qp, 1);
    assert_eq!(r[0].result, Ok(0), "write at {lba}");
}

fn read(qp: &mut QueuePair, c: &Controller, lba: u64, len: usize) -> Completion {
    let ns = c.namespaces()[0];
    let b = IoBuf::new(c.alloc_dma(len).unwrap());
    qp.read(&ns, lba, (len / 512) as u32, b, 2).unwrap();
    wait(qp, 1).pop().unwrap()
}

fn expect_pattern(c: &Completion, len: usize, seed: u8) {
    assert_eq!(c.result, Ok(0));
    let b = c.buf.as_ref().unwrap();
    assert_eq!(b.len(), len);
    assert!(
        b.as_slice() == expected(len, seed),
        "data read back differs"
    );
}

#[test]
fn bring_up_connects_identifies_and_reads_registers() {
    let fake = Fake::start(Script::default());
    let c = open(&fake, Digests::NONE);
    assert_eq!(c.namespaces().len(), 1);
    assert_eq!(c.namespaces()[0].nsze(), NSZE);
    assert_eq!(c.identify().ioccsz, (64 + 8192) / 16);
    assert_eq!(c.cap().mqes(), 127);
    assert_eq!(c.transport().in_capsule_limit(), 8192);
    let seen = fake.seen.lock().unwrap();
    let (qid, cntlid, sub, host, _) = &seen.connects[0];
    assert_eq!((*qid, *cntlid), (0, 0xFFFF));
    assert_eq!((sub.as_str(), host.as_str()), (SUBNQN, HOSTNQN));
    assert!(seen.errors.is_empty(), "{:?}", seen.errors);
}

/// A namespace formatted with metadata (8 bytes per 512-byte block) is
/// skipped: its Reads would move 520 bytes per block into buffers of 512
/// (extended LBA) or write the metadata to MPTR, which pollux never gives.
/// Before, it was listed with 512-byte blocks.
#[test]
fn namespace_with_metadata_is_skipped() {
    let fake = Fake::start(Script {
        ms: 8,
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    assert_eq!(c.namespaces(), &[]);
}

#[test]
fn wrong_subsystem_is_refused_by_connect_naming_it() {
    let fake = Fake::start(Script::default());
    let mut o = opts(&fake, Digests::NONE);
    o.subnqn = "nqn.2026-01.io.pollux:other".into();
    let Err(e) = pollux_tcp::open(o, ControllerOptions::default()) else {
        panic!("Connect to the wrong subsystem succeeded");
    };
    assert!(e.to_string().contains("Connect"), "{e}");
}

#[test]
fn io_queue_connects_with_the_admin_cntlid() {
    let fake = Fake::start(Script::default());
    let c = open(&fake, Digests::NONE);
    let _qp = qpair(&c, 8);
    let seen = fake.seen.lock().unwrap();
    let (qid, cntlid, _, _, kato) = seen.connects[1].clone();
    assert_eq!(qid, 1);
    assert_eq!(cntlid, seen.cntlids[0]);
    assert_eq!(kato, 0);
}

/// I/O queues ask to disable SQ flow control (the admin queue never
/// does); `sqflow` keeps it on; a controller refusing the bit is asked
/// again without it, and the queue works.
#[test]
fn io_queues_ask_to_disable_sq_flow_control() {
    let flow = pollux_spec::fabrics::CATTR_DISABLE_SQ_FLOW;
    let fake = Fake::start(Script::default());
    let c = open(&fake, Digests::NONE);
    let _qp = qpair(&c, 8);
    assert_eq!(fake.seen.lock().unwrap().cattrs, [0, flow]);

    let fake = Fake::start(Script::default());
    let mut o = opts(&fake, Digests::NONE);
    o.sq_flow = true;
    let c = pollux_tcp::open(o, ControllerOptions::default()).expect("bring-up");
    let _qp = qpair(&c, 8);
    assert_eq!(fake.seen.lock().unwrap().cattrs, [0, 0]);

    let fake = Fake::start(Script {
        refuse_sqflow_disable: true,
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 8);
    assert_eq!(fake.seen.lock().unwrap().cattrs, [0, flow, 0]);
    write(&mut qp, &c, 8, 4096, 7);
    let r = read(&mut qp, &c, 8, 4096);
    expect_pattern(&r, 4096, 7);
}

fn round_trip(digests: Digests, c2h_success: bool) {
    let fake = Fake::start(Script {
        c2h_success,
        ..Script::default()
    });
    let c = open(&fake, digests);
    let mut qp = qpair(&c, 8);
    // 4 KiB: in capsule.
    write(&mut qp, &c, 8, 4096, 3);
    {
        let s = fake.seen.lock().unwrap();
        assert_eq!((s.in_capsule_writes, s.r2ts), (1, 0));
    }
    expect_pattern(&read(&mut qp, &c, 8, 4096), 4096, 3);
    // 128 KiB: R2T (32 KiB each), H2CData (16 KiB each); read back in
    // 16 KiB C2HData PDUs.
    write(&mut qp, &c, 256, 128 << 10, 9);
    {
        let s = fake.seen.lock().unwrap();
        assert_eq!((s.in_capsule_writes, s.r2ts, s.h2c_pdus), (1, 4, 8));
    }
    expect_pattern(&read(&mut qp, &c, 256, 128 << 10), 128 << 10, 9);
    let s = fake.seen.lock().unwrap();
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert!(s.digests.iter().all(|d| *d == digests));
}

#[test]
fn in_capsule_and_r2t_writes_read_back() {
    round_trip(Digests::NONE, false);
}

#[test]
fn c2h_success_flag_completes_reads() {
    round_trip(Digests::NONE, true);
}

#[test]
fn header_and_data_digests() {
    round_trip(Digests::BOTH, false);
    round_trip(
        Digests {
            header: true,
            data: false,
        },
        true,
    );
}

/// `sock_impl:uring`, PDUs parsed in the provided buffers or copied out
/// first (`uring_direct`), with and without digests: the controller sends
/// every PDU in writes of 13 or 100 bytes, so headers arrive cut at every
/// offset, or the host has 4 receive buffers of 512 bytes; reads (some
/// outstanding together) and R2T writes come back intact, and so do
/// in-capsule writes answered in a burst.
#[test]
fn uring_with_headers_cut_anywhere() {
    // (4 buffers of 512 bytes: the receive runs out of them and is armed
    // again all the time.)
    let small = (4, 512);
    let default = (pollux_tcp::RX_BUFFERS, pollux_tcp::RX_BUFFER_SIZE);
    for (direct, trickle, (n, size)) in [
        (true, 13, default),
        (true, 100, default),
        (false, 13, default),
        (true, 1 << 20, small),
        (false, 1 << 20, small),
    ] {
        for digests in [Digests::NONE, Digests::BOTH] {
            let fake = Fake::start(Script {
                trickle: Some(trickle),
                c2h_chunk: 1000,
                ..Script::default()
            });
            let mut o = opts(&fake, digests);
            o.sock_impl = pollux_tcp::SockImpl::Uring;
            o.uring.direct = direct;
            o.uring.rx_buffers = n;
            o.uring.rx_buffer_size = size;
            let c = pollux_tcp::open(o, ControllerOptions::default()).expect("bring-up");
            let mut qp = qpair(&c, 8);
            let what = format!("direct {direct}, trickle {trickle}, {n} x {size}, {digests:?}");
            // 16 KiB: R2T, then H2CData.
            write(&mut qp, &c, 0, 16 << 10, 4);
            expect_pattern(&read(&mut qp, &c, 0, 16 << 10), 16 << 10, 4);
            let ns = c.namespaces()[0];
            for i in 0..4u64 {
                let b = IoBuf::new(c.alloc_dma(4096).unwrap());
                qp.read(&ns, i * 8, 8, b, i).unwrap();
            }
            let want = expected(16 << 10, 4);
            for c in wait(&mut qp, 4) {
                assert_eq!(c.result, Ok(0), "{what}");
                let i = c.user_data as usize;
                assert!(
                    c.buf.unwrap().as_slice() == &want[i * 4096..(i + 1) * 4096],
                    "{what}: read {i}"
                );
            }
            // In-capsule writes outstanding together: their answers are
            // 24-byte (28 with a digest) capsules back to back.
            for i in 0..8u64 {
                let mut b = IoBuf::new(c.alloc_dma(4096).unwrap()).truncate(512);
                b.as_mut_slice().fill(i as u8);
                qp.write(&ns, 64 + i, 1, b, i).unwrap();
            }
            for c in wait(&mut qp, 8) {
                assert_eq!(c.result, Ok(0), "{what}");
            }
            for i in 0..8u64 {
                let r = read(&mut qp, &c, 64 + i, 512);
                assert_eq!(r.result, Ok(0), "{what}");
                let b = r.buf.unwrap();
                assert!(
                    b.as_slice().iter().all(|&x| x == i as u8),
                    "{what}: block {i}"
                );
            }
            let s = fake.seen.lock().unwrap();
            assert!(s.errors.is_empty(), "{what}: {:?}", s.errors);
        }
    }
}

#[test]
fn many_outstanding_reads_complete() {
    let fake = Fake::start(Script {
        batch_reads: 16,
        c2h_chunk: 1000,
        ..Script::default()
    });
    let c = open(&fake, Digests::BOTH);
    let mut qp = qpair(&c, 32);
    write(&mut qp, &c, 0, 64 << 10, 5);
    let ns = c.namespaces()[0];
    for i in 0..16u64 {
        let b = IoBuf::new(c.alloc_dma(4096).unwrap());
        qp.read(&ns, i * 8, 8, b, i).unwrap();
    }
    let got = wait(&mut qp, 16);
    let want = expected(64 << 10, 5);
    for c in got {
        assert_eq!(c.result, Ok(0));
        let i = c.user_data as usize;
        assert!(c.buf.unwrap().as_slice() == &want[i * 4096..(i + 1) * 4096]);
    }
}

#[test]
fn bad_data_digest_fails_the_command_not_the_queue() {
    let fake = Fake::start(Script {
        bad_ddgst_read: Some(1),
        ..Script::default()
    });
    let c = open(&fake, Digests::BOTH);
    let mut qp = qpair(&c, 4);
    let r = read(&mut qp, &c, 0, 4096);
    match r.result {
        Err(IoError::Nvme(s)) => assert_eq!((s.sct(), s.sc()), (0, 0x22), "{s}"),
        other => panic!("{other:?}"),
    }
    // The queue goes on.
    write(&mut qp, &c, 0, 4096, 1);
    expect_pattern(&read(&mut qp, &c, 0, 4096), 4096, 1);
}

#[test]
fn c2h_data_beyond_the_buffer_fails_without_overflow() {
    let fake = Fake::start(Script {
        overflow_read: Some(1),
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 4);
    let ns = c.namespaces()[0];
    // Two neighbouring pieces of one allocation: the read goes into the
    // first; the second must keep its bytes.
    let (a, mut b) = IoBuf::new(c.alloc_dma(8192).unwrap()).split_at(4096);
    b.as_mut_slice().fill(0x5A);
    qp.read(&ns, 0, 8, a, 7).unwrap();
    let got = wait(&mut qp, 1);
    // The connection ends; the read goes again on a new association,
    // where the controller answers it properly.
    assert_eq!(got[0].result, Ok(0));
    assert_eq!(c.resets(), 1);
    assert!(
        b.as_slice().iter().all(|&x| x == 0x5A),
        "neighbour overwritten"
    );
    // The host told the controller why: FES 04h (data transfer out of range).
    let start = Instant::now();
    while fake.seen.lock().unwrap().term_reqs.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fake.seen.lock().unwrap().term_reqs[0].0, 0x04);
}

/// The commands outstanding when the connection drops are sent again on
/// the new association (Linux's and SPDK's hosts retry them too): none
/// fails, each reads what it should.
#[test]
fn dropped_connection_retries_outstanding_on_a_new_association() {
    let fake = Fake::start(Script {
        drop_on_read: Some(4),
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 8);
    write(&mut qp, &c, 0, 4096, 2);
    let ns = c.namespaces()[0];
    // Reads 1-3 complete; read 4 makes the controller drop the connection;
    // 5-8 are outstanding behind it.
    for i in 0..8u64 {
        let b = IoBuf::new(c.alloc_dma(512).unwrap());
        qp.read(&ns, i, 1, b, i).unwrap();
    }
    let got = wait(&mut qp, 8);
    assert!(
        got.iter().all(|c| c.result == Ok(0)),
        "{:?}",
        got.iter().map(|c| c.result).collect::<Vec<_>>()
    );
    let want = expected(4096, 2);
    for c in &got {
        let i = c.user_data as usize;
        assert!(
            c.buf.as_ref().unwrap().as_slice() == &want[i * 512..(i + 1) * 512],
            "read {i} has the wrong data"
        );
    }
    assert_eq!(c.resets(), 1);
    assert!(!c.is_failed());
    // A new association (a second controller ID), and the queue works on it.
    expect_pattern(&read(&mut qp, &c, 0, 4096), 4096, 2);
    let s = fake.seen.lock().unwrap();
    assert_eq!(s.cntlids.len(), 2, "{:?}", s.cntlids);
    let io_connects: Vec<_> = s.connects.iter().filter(|c| c.0 == 1).collect();
    assert_eq!(io_connects.len(), 2);
    assert_eq!(io_connects[1].1, s.cntlids[1]);
}

#[test]
fn dropped_connection_without_reconnect_fails_the_controller() {
    let fake = Fake::start(Script {
        drop_on_read: Some(1),
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 8);
    fake.refuse_connections();
    let ns = c.namespaces()[0];
    for i in 0..4u64 {
        let b = IoBuf::new(c.alloc_dma(512).unwrap());
        qp.read(&ns, i, 1, b, i).unwrap();
    }
    let got = wait(&mut qp, 4);
    assert!(
        got.iter()
            .all(|c| c.result == Err(IoError::ControllerFailed)),
        "{:?}",
        got.iter().map(|c| c.result).collect::<Vec<_>>()
    );
    assert!(c.is_failed());
    // Later submissions are refused at once, naming the cause.
    let b = IoBuf::new(c.alloc_dma(512).unwrap());
    let e = qp.read(&ns, 0, 1, b, 0).unwrap_err();
    assert_eq!(e.error, pollux_nvme::SubmitError::ControllerFailed);
}

#[test]
fn termination_request_retries_outstanding() {
    let fake = Fake::start(Script {
        term_on_read: Some(2),
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 8);
    let ns = c.namespaces()[0];
    for i in 0..4u64 {
        let b = IoBuf::new(c.alloc_dma(512).unwrap());
        qp.read(&ns, i, 1, b, i).unwrap();
    }
    let got = wait(&mut qp, 4);
    assert!(
        got.iter().all(|c| c.result == Ok(0)),
        "{:?}",
        got.iter().map(|c| c.result).collect::<Vec<_>>()
    );
    assert_eq!(c.resets(), 1);
}

#[test]
fn keep_alive_is_sent() {
    let fake = Fake::start(Script::default());
    let mut o = opts(&fake, Digests::NONE);
    o.kato_ms = 100;
    let c = pollux_tcp::open(o, ControllerOptions::default()).unwrap();
    let start = Instant::now();
    while fake.seen.lock().unwrap().keep_alives < 3 {
        assert!(start.elapsed() < Duration::from_secs(20), "no keep-alives");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        fake.seen.lock().unwrap().connects[0].4,
        100,
        "KATO in Connect"
    );
    drop(c);
}

#[test]
fn foreign_buffers_are_refused() {
    let fake = Fake::start(Script::default());
    let c = open(&fake, Digests::NONE);
    let mut qp = qpair(&c, 4);
    let ns = c.namespaces()[0];
    // A buffer whose bus addresses are not this transport's.
    let b = IoBuf::new(foreign(4096));
    let e = qp.read(&ns, 0, 8, b, 0).unwrap_err();
    assert_eq!(e.error, pollux_nvme::SubmitError::BadBuffer);
}

struct Leak;
impl pollux_nvme::dma::DmaRelease for Leak {
    fn release(&self, ptr: std::ptr::NonNull<u8>, len: usize, _iova: u64) {
        // SAFETY: allocated by `foreign` with this layout.
        unsafe {
            std::alloc::dealloc(
                ptr.as_ptr(),
                std::alloc::Layout::from_size_align(len, 4096).unwrap(),
            )
        }
    }
}

/// A buffer as another transport would make it: its bus address is not
/// its virtual address.
fn foreign(len: usize) -> pollux_nvme::DmaBuffer {
    let l = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    // SAFETY: non-zero size.
    let p = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(l) }).unwrap();
    // SAFETY: `p` is a fresh allocation of `len` bytes, released by `Leak`
    // with the same layout; the bus address is one a PCIe platform could
    // hand out.
    unsafe {
        pollux_nvme::DmaBuffer::from_raw(
            p,
            len,
            pollux_nvme::dma::Iova::Contiguous(0x10_0000),
            std::sync::Arc::new(Leak),
        )
    }
}

#[test]
fn discovery_log_is_read() {
    let fake = Fake::start(Script::default());
    let mut o = opts(&fake, Digests::NONE);
    o.subnqn = String::new();
    let entries = pollux_tcp::discover(o).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].subnqn().unwrap(), SUBNQN);
    assert_eq!(entries[0].trsvcid_str(), fake.addr.port().to_string());
    let s = fake.seen.lock().unwrap();
    assert_eq!(s.connects[0].2, pollux_spec::fabrics::DISCOVERY_NQN);
}

/// A controller that sends fewer bytes than an admin command's length
/// (a log page shorter than NUMD asks for; the spec leaves the bytes past
/// a log's end undefined) and then success: the command succeeds, the
/// bytes it did not send read as zeros. Before, the host failed it with
/// Data Transfer Error.
#[test]
fn a_short_admin_transfer_succeeds_zero_filled() {
    let f = Fake::start(Script::default());
    let c = open(&f, Digests::NONE);
    let mut buf = IoBuf::new(c.alloc_dma(512).unwrap());
    buf.as_mut_slice().fill(0xFF);
    let sqe = pollux_spec::Sqe::get_log_page(0x03, 0, 512, 0, 0, 0);
    let (cqe, buf) = c.admin(sqe, Some(buf)).expect("Get Log Page");
    assert!(cqe.status().is_success(), "{:#x}", cqe.status().0);
    let buf = buf.expect("the buffer comes back");
    let d = buf.as_slice();
    assert!(d[..64].iter().all(|&b| b == 0xA5), "the 64 bytes sent");
    assert!(d[64..512].iter().all(|&b| b == 0), "zeros past them");
    assert!(f.seen.lock().unwrap().errors.is_empty());
}

/// A Get Log Page that times out; its answer arrives later (received by
/// the next register access). The link must not copy that data anywhere
/// (before, it copied it into the timed-out command's buffer, which the
/// caller had got back and could have freed); since `Controller::admin`
/// takes the buffer by value, a timed-out command's buffer stays parked
/// with the admin queue, so the caller never holds memory the late answer
/// could reach. The admin queue goes on past the late completion.
#[test]
fn late_admin_data_is_not_copied_into_a_buffer_after_its_timeout() {
    let fake = Fake::start(Script {
        hold_log_page: true,
        ..Script::default()
    });
    let c = pollux_tcp::open(
        opts(&fake, Digests::NONE),
        ControllerOptions {
            admin_timeout: Duration::from_millis(300),
            ..ControllerOptions::default()
        },
    )
    .expect("bring-up");
    let mut buf = IoBuf::new(c.alloc_dma(4096).unwrap());
    buf.as_mut_slice().fill(0x5A);
    // SMART / Health Information, 4 KiB.
    let sqe = pollux_spec::Sqe::get_log_page(0x02, 0xFFFF_FFFF, 4096, 0, 0, 0);
    match c.admin(sqe, Some(buf)) {
        Err(pollux_nvme::Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The controller answers now, ahead of the answer to the next command:
    // a Property Get (CSTS) receives both.
    fake.release_log
        .store(true, std::sync::atomic::Ordering::Release);
    c.csts().expect("CSTS");
    assert_eq!(fake.seen.lock().unwrap().late_logs, 1, "late answer sent");
    // The admin queue goes on: the late completion is skipped.
    let got = c.admin(pollux_spec::Sqe::get_features(0x07, 0), None);
    assert!(got.is_ok(), "{got:?}");
}

/// A controller that answers an in-capsule write before it has read the
/// data: the write completes and its buffer comes back while its bytes are
/// still queued to be sent. They must leave as they were when the command
/// was submitted, whatever the caller does with the buffer afterwards.
#[test]
fn early_answer_to_an_in_capsule_write_leaves_its_data_intact() {
    const LEN: usize = 128 << 10;
    const N: u16 = 127;
    let fake = Fake::start(Script {
        icd: LEN as u32,
        answer_early: Some(N - 1),
        ..Script::default()
    });
    let c = open(&fake, Digests::NONE);
    assert_eq!(c.transport().in_capsule_limit(), LEN as u32);
    let mut qp = qpair(&c, N);
    let ns = c.namespaces()[0];
    // 127 writes of 128 KiB (16 MiB in all, far more than the socket
    // buffers hold): the last is still queued in the host when the
    // controller answers it (CIDs are handed out from 0 up).
    for i in 0..N {
        let mut b = IoBuf::new(c.alloc_dma(LEN).unwrap());
        pattern(&mut b, i as u8);
        qp.write(&ns, 0, (LEN / 512) as u32, b, i as u64).unwrap();
    }
    let mut early = wait(&mut qp, 1);
    let mut e = early.pop().unwrap();
    assert_eq!((e.user_data, e.result), ((N - 1) as u64, Ok(0)));
    // The buffer is the caller's again.
    e.buf.as_mut().unwrap().as_mut_slice().fill(0xEE);
    fake.release_reads
        .store(true, std::sync::atomic::Ordering::Release);
    let rest = wait(&mut qp, N as usize - 1);
    assert!(rest.iter().all(|c| c.result == Ok(0)));
    // The controller reads the last command after those it answered;
    // the host sends its bytes as it polls.
    let start = Instant::now();
    while fake.seen.lock().unwrap().early_data.is_empty() {
        qp.poll(u32::MAX, |_, c| {
            panic!("unexpected completion {:?}", c.result)
        });
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "data never arrived"
        );
        std::thread::yield_now();
    }
    drop(e);
    let s = fake.seen.lock().unwrap();
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(s.early_data.len(), LEN);
    assert!(
        s.early_data == expected(LEN, (N - 1) as u8),
        "the controller received the buffer's later contents, not the write's data"
    );
}

/// Options for the reconnect tests: attempts every 50 ms for up to a
/// minute (the tests let the fake accept again long before).
fn reconnecting(fake: &Fake) -> TcpOptions {
    let mut o = opts(fake, Digests::NONE);
    o.ctrl_loss_tmo = Some(Duration::from_secs(60));
    o.reconnect_delay = Duration::from_millis(50);
    o
}

/// Waits (hang guard: 20 s) until `cond` holds.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// While a reset reconnects (the controller refuses connections), an I/O
/// thread's polls go on returning — its CSTS ticks included (a 100 ms
/// command timeout: a tick every 50 ms) — and its I/O is held, neither
/// failed nor lost; once the controller is back, the read outstanding at
/// the failure completes on the new association.
#[test]
fn polls_return_while_a_reconnect_runs_and_the_io_is_held() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let fake = Fake::start(Script {
        drop_on_read: Some(2),
        ..Script::default()
    });
    let c = Arc::new(pollux_tcp::open(reconnecting(&fake), ControllerOptions::default()).unwrap());
    let mut qp = c
        .alloc_qpair(QpairOptions {
            depth: 8,
            timeout: Some(Duration::from_millis(100)),
            ..QpairOptions::default()
        })
        .unwrap();
    write(&mut qp, &c, 0, 4096, 4);
    expect_pattern(&read(&mut qp, &c, 0, 4096), 4096, 4); // read 1
    fake.refuse_connections();
    let polls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (p, s, ctrl) = (polls.clone(), stop.clone(), c.clone());
    let poller = std::thread::spawn(move || {
        let ns = ctrl.namespaces()[0];
        let b = IoBuf::new(ctrl.alloc_dma(4096).unwrap());
        qp.read(&ns, 0, 8, b, 9).unwrap(); // read 2: the connection drops
        let mut got = Vec::new();
        while !s.load(Ordering::Acquire) || got.is_empty() {
            qp.poll(u32::MAX, |_, c| got.push(c));
            p.fetch_add(1, Ordering::Release);
        }
        (got, qp.in_flight())
    });
    let t = c.transport();
    until("no reconnect attempts", || t.reconnect_attempts() >= 3);
    let before = polls.load(Ordering::Acquire);
    until("polls stopped returning while reconnecting", || {
        polls.load(Ordering::Acquire) > before + 50_000
    });
    assert!(
        t.is_reconnecting() && !c.is_failed(),
        "the reconnect is still running"
    );
    assert!(t.reconnect_attempts() >= 3);
    fake.accept_connections();
    stop.store(true, Ordering::Release);
    let (got, in_flight) = poller.join().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].user_data, 9);
    expect_pattern(&got[0], 4096, 4);
    assert_eq!(in_flight, 0);
    assert_eq!(c.resets(), 1);
}

/// With `fast_io_fail_tmo`, I/O held while reconnecting fails once that
/// time has passed, with an error that says so (and so does I/O submitted
/// meanwhile); the reconnect goes on, and I/O works again after it.
#[test]
fn held_io_fails_after_fast_io_fail_tmo() {
    let fake = Fake::start(Script {
        drop_on_read: Some(1),
        ..Script::default()
    });
    let mut o = reconnecting(&fake);
    o.fast_io_fail_tmo = Some(Duration::from_millis(300));
    let c = pollux_tcp::open(o, ControllerOptions::default()).unwrap();
    let mut qp = qpair(&c, 8);
    write(&mut qp, &c, 0, 4096, 6);
    fake.refuse_connections();
    let ns = c.namespaces()[0];
    for i in 0..4u64 {
        let b = IoBuf::new(c.alloc_dma(512).unwrap());
        qp.read(&ns, i, 1, b, i).unwrap();
    }
    let got = wait(&mut qp, 4);
    assert!(
        got.iter()
            .all(|c| c.result == Err(IoError::FastFail) && c.buf.is_some()),
        "{:?}",
        got.iter().map(|c| c.result).collect::<Vec<_>>()
    );
    assert!(IoError::FastFail.to_string().contains("fast_io_fail_tmo"));
    assert!(c.transport().is_reconnecting() && !c.is_failed());
    // Still reconnecting: new I/O fails fast too.
    let b = IoBuf::new(c.alloc_dma(512).unwrap());
    qp.read(&ns, 0, 1, b, 7).unwrap();
    let r = wait(&mut qp, 1);
    assert_eq!(r[0].result, Err(IoError::FastFail));
    fake.accept_connections();
    until("no reconnect", || !c.transport().is_reconnecting());
    expect_pattern(&read(&mut qp, &c, 0, 4096), 4096, 6);
}

/// A handler that submits again from each completion, as perf and
/// bdevperf do, while `fast_io_fail_tmo` has passed: each poll fails what
/// was held when it began and returns; what the handler submitted fails on
/// the next poll. Before, one poll failed the backlog until it was empty
/// while the handler refilled it, and never returned (perf hung for good
/// when its target went away with `fast_io_fail_tmo` set).
#[test]
fn a_handler_resubmitting_fast_failed_io_does_not_hold_the_poll() {
    use std::sync::mpsc;
    let fake = Fake::start(Script {
        drop_on_read: Some(1),
        ..Script::default()
    });
    let mut o = reconnecting(&fake);
    o.fast_io_fail_tmo = Some(Duration::from_millis(300));
    let c = std::sync::Arc::new(pollux_tcp::open(o, ControllerOptions::default()).unwrap());
    let mut qp = qpair(&c, 8);
    write(&mut qp, &c, 0, 4096, 6);
    fake.refuse_connections();
    let ns = c.namespaces()[0];
    for i in 0..4u64 {
        let b = IoBuf::new(c.alloc_dma(512).unwrap());
        qp.read(&ns, i, 1, b, i).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let poller = std::thread::spawn(move || {
        // Polls until fast-failed completions came in three polls, each
        // failure submitted again at once from the handler.
        let start = Instant::now();
        let mut per_poll = Vec::new();
        while per_poll.len() < 3 && start.elapsed() < Duration::from_secs(20) {
            let mut n = 0usize;
            qp.poll(u32::MAX, |sub, done| {
                assert_eq!(done.result, Err(IoError::FastFail));
                n += 1;
                let buf = done.buf.expect("the buffer comes back");
                sub.read(&ns, done.user_data, 1, buf, done.user_data)
                    .expect("resubmit");
            });
            if n > 0 {
                per_poll.push(n);
                let _ = tx.send(n);
            }
            std::thread::yield_now();
        }
        per_poll
    });
    for _ in 0..3 {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(n) => assert!(n <= 4, "one poll failed {n} requests: more than were held"),
            Err(_) => panic!("a poll did not return: it keeps failing what its handler submits"),
        }
    }
    let per_poll = poller.join().unwrap();
    assert_eq!(per_poll, vec![4, 4, 4]);
    assert!(c.transport().is_reconnecting() && !c.is_failed());
}

/// A command that brings the connection down every time it is sent is
/// sent again after each reset at most 5 times (Linux's nvme_max_retries),
/// then fails with Command Aborted By Host; the queue goes on.
#[test]
fn a_command_that_kills_every_connection_is_retried_five_times() {
    let fake = Fake::start(Script {
        drop_on_lba: Some(7),
        ..Script::default()
    });
    let c = pollux_tcp::open(reconnecting(&fake), ControllerOptions::default()).unwrap();
    let mut qp = qpair(&c, 8);
    write(&mut qp, &c, 0, 4096, 8);
    let r = read(&mut qp, &c, 7, 512);
    match r.result {
        Err(IoError::Nvme(s)) => assert_eq!((s.sct(), s.sc()), (3, 0x71), "{s}"),
        other => panic!("{other:?}"),
    }
    assert!(r.buf.is_some());
    assert_eq!(
        fake.seen.lock().unwrap().poison_reads,
        6,
        "sent 1 + 5 times"
    );
    assert_eq!(c.resets(), 6);
    expect_pattern(&read(&mut qp, &c, 0, 4096), 4096, 8);
}
