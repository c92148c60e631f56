//! Handshake timeouts: a connection that does not send its ICReq, or
//! whose queue is not connected (Fabrics Connect accepted) after ICResp,
//! within the configured time is closed and stops counting against
//! the connection budgets; a connection that completes its handshake
//! keeps working however long it then stays quiet; queues beyond
//! `max_connections` are refused at Connect.
//!
//! No timing assertion: the short timeouts only make the closes come
//! soon; each test waits generously (20 s) for what must happen.
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use pollux_nvmf::{Target, TransportOptions};
use pollux_spec::features::fid;
use pollux_spec::tcp::{Digests, IcReq};
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

/// How long a test waits for what must happen.
const PATIENCE: Duration = Duration::from_secs(20);

fn target(timeout: Duration, max_connections: usize) -> Target {
    target_on(timeout, max_connections, pollux_nvmf::SockImpl::Posix)
}

fn target_on(timeout: Duration, max_connections: usize, si: pollux_nvmf::SockImpl) -> Target {
    let opts = TransportOptions {
        icreq_timeout: timeout,
        connect_timeout: timeout,
        max_connections,
        sock_impl: si,
        ..Default::default()
    };
    ram_target_with(1024, opts, &[0])
}

/// True once the target has closed `s` (end of stream or reset), reading
/// and dropping whatever it sent before; false if it is still open after
/// [`PATIENCE`].
fn closed_by_target(s: &mut TcpStream) -> bool {
    let deadline = Instant::now() + PATIENCE;
    let mut b = [0u8; 4096];
    while Instant::now() < deadline {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    false
}

/// Waits until the target counts `n` connections; false after
/// [`PATIENCE`].
fn connections_become(t: &Target, n: usize) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if t.connections() == n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_socket_that_never_sends_icreq_is_closed() {
    let t = target(Duration::from_millis(200), 16);
    let addr = t.listen_addrs()[0];
    let mut silent = TcpStream::connect(addr).unwrap();
    // Half an ICReq, then nothing: still no ICReq.
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&IcReq::new(0, Digests::NONE, 0).as_bytes()[..64])
        .unwrap();
    assert!(closed_by_target(&mut silent), "silent socket still open");
    assert!(closed_by_target(&mut half), "half-ICReq socket still open");
    assert!(
        connections_become(&t, 0),
        "{} connections still counted",
        t.connections()
    );
}

#[test]
fn a_queue_never_connected_is_closed() {
    let t = target(Duration::from_millis(200), 16);
    let addr = t.listen_addrs()[0];
    // ICReq, then nothing.
    let mut idle = Client::connect(addr);
    idle.ic(Digests::NONE);
    // ICReq, then a Connect the target refuses (unknown subsystem).
    let mut refused = Client::connect(addr);
    refused.ic(Digests::NONE);
    let r = refused.admin_connect("nqn.2024-01.io.pollux:nobody", HOST_A, 0);
    assert!(!r.status().is_success(), "Connect to an unknown subsystem");
    assert!(closed_by_target(&mut idle.s), "idle queue still open");
    assert!(closed_by_target(&mut refused.s), "refused queue still open");
    // ICReq, then Keep Alive capsules (each answered with an error, the
    // queue not being connected) without end: busy, yet never connected.
    let mut chatty = Client::connect(addr);
    chatty.ic(Digests::NONE);
    chatty.s.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut closed = false;
    let mut b = [0u8; 4096];
    'outer: while Instant::now() < deadline {
        let mut ka = Sqe::new(0x18, 0);
        ka.cid = chatty.next_cid();
        let (h, l) = pollux_spec::tcp::CapsuleCmd::new(&ka, 0, Digests::NONE, 0).unwrap();
        let mut pdu = vec![0u8; l.plen as usize];
        pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut pdu).unwrap();
        if chatty.s.write_all(&pdu).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        loop {
            match chatty.s.read(&mut b) {
                Ok(0) => {
                    closed = true;
                    break 'outer;
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break 'outer;
                }
            }
        }
    }
    assert!(
        closed,
        "a queue sending commands but never Connect still open"
    );
    assert!(
        connections_become(&t, 0),
        "{} connections still counted",
        t.connections()
    );
}

/// Brings up an admin queue and I/O queue 1 and checks a write reads back.
fn good_host(addr: SocketAddr, host: &str) -> (Client, Client) {
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, host, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, host, false);
    check_io(&mut q, 1);
    (a, q)
}

fn check_io(q: &mut Client, seed: u8) {
    let d = pattern(4096, seed);
    assert!(q.write(1, 8, &d, true).status().is_success());
    assert_eq!(q.read(1, 8, 4096).0, d);
}

#[test]
fn timed_out_handshakes_free_their_connection_slots() {
    // Long enough for a host on loopback to finish its handshake on a
    // loaded machine; the silent sockets close after it.
    let timeout = Duration::from_millis(500);
    let t = target(timeout, 2);
    let addr = t.listen_addrs()[0];
    // Two sockets that never send anything.
    let mut a = TcpStream::connect(addr).unwrap();
    let mut b = TcpStream::connect(addr).unwrap();
    assert!(connections_become(&t, 2), "the two sockets not accepted");
    assert!(closed_by_target(&mut a), "first silent socket still open");
    assert!(closed_by_target(&mut b), "second silent socket still open");
    assert!(
        connections_become(&t, 0),
        "{} connections still counted",
        t.connections()
    );
    // The slots are free: a host gets its two queues.
    let (mut admin, mut io) = good_host(addr, HOST_A);
    assert_eq!(t.connections(), 2);
    // Connected queues are past their handshake: quiet for several
    // timeouts, they stay (Keep Alive is off: KATO 0).
    std::thread::sleep(timeout * 4);
    check_io(&mut io, 2);
    let mut ka = Sqe::new(0x18, 0);
    ka.cid = admin.next_cid();
    admin.capsule(&ka, &[]);
    assert!(admin.resp().status().is_success());
    assert_eq!(t.connections(), 2);
}

/// `max_connections` bounds the queues of NVM subsystems: beyond it a
/// Connect is refused with Connect Controller Busy (the socket is not
/// reset at accept), while the discovery controller still answers.
#[test]
fn connects_beyond_max_connections_are_refused_busy() {
    for si in SOCK_IMPLS {
        eprintln!("sock_impl {si:?}");
        connects_beyond_max_connections_are_refused_busy_on(si);
    }
}

fn connects_beyond_max_connections_are_refused_busy_on(si: pollux_nvmf::SockImpl) {
    let t = target_on(Duration::from_secs(10), 2, si);
    let addr = t.listen_addrs()[0];
    let (_admin, _io) = good_host(addr, HOST_A);
    let mut third = Client::connect(addr);
    third.ic(Digests::NONE);
    let r = third.admin_connect(SUB1, HOST_B, 0);
    assert_eq!(
        r.status(),
        pollux_spec::fabrics::fabrics_status(pollux_spec::fabrics::fabrics_sc::CONTROLLER_BUSY),
        "Connect beyond max_connections"
    );
    let mut disc = Client::connect(addr);
    disc.ic(Digests::NONE);
    let r = disc.admin_connect(pollux_spec::fabrics::DISCOVERY_NQN, HOST_B, 0);
    assert!(r.status().is_success(), "discovery Connect");
}
