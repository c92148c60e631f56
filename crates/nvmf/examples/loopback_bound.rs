//! What the kernel alone moves over loopback TCP: a bare sender on core 0
//! writes what a target sends for 4 KiB reads (a 24-byte C2HData header
//! and 4 KiB of data per PDU, `--batch` PDUs per `writev`) and a bare
//! receiver on core 1 reads them into a 256 KiB buffer. No parsing, no
//! commands, no requests the other way: an upper bound for any NVMe/TCP
//! target on one core of this machine with this kernel (its figure is
//! what `bench/tcp.sh` compares the target with).
//!
//! With `--rtt`, the floor of a QD 1 read instead: the receiver on core 1
//! sends a 72-byte command capsule, the sender on core 0 answers with a
//! 24-byte header and 4 KiB, one at a time, both polling; it prints the
//! round trip's mean, p50 and p99 (the mean beside the average latency
//! the perf tools print).
//!
//! With `--qd N`, the floor of a QD N read workload: the receiver on core 1
//! keeps N 72-byte requests outstanding (writing a new one for each
//! response it has read), the sender on core 0 reads them and answers each
//! with a 24-byte header and 4 KiB (up to 256 answers per `writev`), both
//! polling and doing nothing else: the same bytes both ways as `pollux
//! perf` against `pollux target`, without NVMe.
//!
//! With `--empty-poll`, what one receive that finds nothing costs on this
//! kernel, as `recv` and as `readv` (the target polls its sockets so).
//!
//! `cargo run --release -p pollux-nvmf --example loopback_bound --
//! [--batch N] [--bufs N] [--size BYTES] [--secs S] [--rtt | --qd N | --empty-poll] [--json]`
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn pin(core: usize) {
    if let Err(e) = pollux_runtime::pin_to_core(core) {
        eprintln!("loopback_bound: {e}; running unpinned");
    }
}

/// CPU time of the calling thread (user + system).
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut r);
        r
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(r.ru_utime) + tv(r.ru_stime)
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) if v > 0 => v,
            _ => {
                eprintln!("loopback_bound: {name} takes a positive number");
                std::process::exit(2)
            }
        },
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let batch = arg(&args, "--batch", 27).min(512) as usize;
    let bufs = arg(&args, "--bufs", 128) as usize;
    let size = arg(&args, "--size", 4096) as usize;
    let secs = arg(&args, "--secs", 3);
    let json = args.iter().any(|a| a == "--json");
    if args.iter().any(|a| a == "--rtt") {
        return round_trips(size, secs, json);
    }
    if args.iter().any(|a| a == "--qd") {
        return closed_loop(arg(&args, "--qd", 128) as usize, bufs, size, secs, json);
    }
    if args.iter().any(|a| a == "--empty-poll") {
        return empty_polls(json);
    }

    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut tx = TcpStream::connect(l.local_addr()?)?;
    let (mut rx, _) = l.accept()?;
    tx.set_nodelay(true)?;
    // Both sides poll, as the target and `pollux perf` do (a sleeping
    // side would measure wake-up latency, not CPU).
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    let reader = std::thread::spawn(move || {
        pin(1);
        let mut b = vec![0u8; 256 << 10];
        let (mut n, mut calls) = (0u64, 0u64);
        let c0 = thread_cpu();
        loop {
            match rx.read(&mut b) {
                Ok(0) => break,
                Ok(k) => {
                    n += k as u64;
                    calls += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(_) => break,
            }
        }
        (n, calls, thread_cpu() - c0)
    });
    pin(0);
    let data = vec![0x5au8; bufs * size];
    let hdr = [0u8; 24];
    let (mut sent, mut calls, mut i) = (0u64, 0u64, 0usize);
    let c0 = thread_cpu();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(2 * batch);
    while Instant::now() < end {
        iov.clear();
        for _ in 0..batch {
            let k = i % bufs;
            iov.push(IoSlice::new(&hdr));
            iov.push(IoSlice::new(&data[k * size..(k + 1) * size]));
            i += 1;
        }
        // A short write leaves the rest of the batch unsent (the next
        // batch follows it): only bytes are counted.
        match tx.write_vectored(&iov) {
            Ok(k) => sent += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        calls += 1;
    }
    let cpu = thread_cpu() - c0;
    let el = t0.elapsed().as_secs_f64();
    tx.set_nonblocking(false)?;
    drop(tx);
    let (got, rcalls, rcpu) = reader.join().unwrap_or((0, 0, Duration::ZERO));
    let pdu = (size + hdr.len()) as f64;
    let per_s = got as f64 / pdu / el;
    let per_tx_core = sent as f64 / pdu / cpu.as_secs_f64().max(1e-9);
    let per_rx_core = got as f64 / pdu / rcpu.as_secs_f64().max(1e-9);
    if json {
        println!(
            "{{\"pdus_per_s\": {per_s:.0}, \"per_sender_core\": {per_tx_core:.0}, \"per_receiver_core\": {per_rx_core:.0}, \
             \"sender_cpu\": {:.3}, \"receiver_cpu\": {:.3}, \"writes\": {calls}, \"reads\": {rcalls}}}",
            cpu.as_secs_f64() / el,
            rcpu.as_secs_f64() / el
        );
    } else {
        println!(
            "{size} B + 24 B PDUs, {batch} per writev: {:.1} K/s; sender {:.2} cores ({:.1} K per core), receiver {:.2} cores ({:.1} K per core)",
            per_s / 1e3,
            cpu.as_secs_f64() / el,
            per_tx_core / 1e3,
            rcpu.as_secs_f64() / el,
            per_rx_core / 1e3
        );
    }
    Ok(())
}

/// Reads exactly `b.len()` bytes from a non-blocking stream, polling.
fn read_all(s: &mut TcpStream, b: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < b.len() {
        match s.read(&mut b[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `b` to a non-blocking stream, polling (`Write::write_all`
/// gives up on `WouldBlock`).
fn write_all(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < b.len() {
        match s.write(&b[off..]) {
            Ok(k) => off += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connected (client, server) pair over loopback, both non-blocking
/// with Nagle off.
fn polling_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(l.local_addr()?)?;
    let (server, _) = l.accept()?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    Ok((client, server))
}

/// `--rtt`: one 72-byte request, one 24-byte + `size` response, in turn.
fn round_trips(size: usize, secs: u64, json: bool) -> std::io::Result<()> {
    let (mut client, mut server) = polling_pair()?;
    let responder = std::thread::spawn(move || -> std::io::Result<()> {
        pin(0);
        let (mut req, hdr, data) = ([0u8; 72], [0u8; 24], vec![0x5au8; size]);
        loop {
            match read_all(&mut server, &mut req) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            // One writev, as a target sends its C2HData.
            let iov = [IoSlice::new(&hdr), IoSlice::new(&data)];
            let mut sent = match server.write_vectored(&iov) {
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(e),
            };
            if sent < hdr.len() {
                write_all(&mut server, &hdr[sent..])?;
                sent = hdr.len();
            }
            write_all(&mut server, &data[sent - hdr.len()..])?;
        }
    });
    pin(1);
    let (req, mut back) = ([0u8; 72], vec![0u8; 24 + size]);
    let mut lat = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let t = Instant::now();
        write_all(&mut client, &req)?;
        read_all(&mut client, &mut back)?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    drop(client);
    match responder.join() {
        Ok(r) => r?,
        Err(_) => return Err(std::io::Error::other("responder panicked")),
    }
    let mean = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64 / 1e3;
    lat.sort_unstable();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e3
    };
    if json {
        println!(
            "{{\"mean_us\": {mean:.2}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"round_trips\": {}}}",
            at(0.5),
            at(0.99),
            lat.len()
        );
    } else {
        println!(
            "72 B request, 24 B + {size} B response, both polling: mean {mean:.1} us, p50 {:.1} us, p99 {:.1} us over {} round trips",
            at(0.5),
            at(0.99),
            lat.len()
        );
    }
    Ok(())
}

/// `--qd`: `qd` requests outstanding, answered in batches.
fn closed_loop(qd: usize, bufs: usize, size: usize, secs: u64, json: bool) -> std::io::Result<()> {
    const REQ: usize = 72;
    const HDR: usize = 24;
    const MAX_BATCH: usize = 256;
    let (mut client, mut server) = polling_pair()?;
    let responder = std::thread::spawn(move || -> std::io::Result<Duration> {
        pin(0);
        let c0 = thread_cpu();
        let (mut rb, hdr, data) = (vec![0u8; 64 << 10], [0u8; HDR], vec![0x5au8; bufs * size]);
        let resp = HDR + size;
        // Requests read and not yet answered; bytes of a request read in
        // part; bytes of the next answer already written.
        let (mut owed, mut carry, mut partial, mut k) = (0usize, 0usize, 0usize, 0usize);
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(2 * MAX_BATCH);
        loop {
            match server.read(&mut rb) {
                Ok(0) => return Ok(thread_cpu() - c0),
                Ok(n) => {
                    owed += (carry + n) / REQ;
                    carry = (carry + n) % REQ;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Ok(thread_cpu() - c0)
                }
                Err(e) => return Err(e),
            }
            if owed == 0 {
                continue;
            }
            iov.clear();
            for j in 0..owed.min(MAX_BATCH) {
                let b = (k + j) % bufs;
                let d = &data[b * size..(b + 1) * size];
                let skip = if j == 0 { partial } else { 0 };
                if skip < HDR {
                    iov.push(IoSlice::new(&hdr[skip..]));
                    iov.push(IoSlice::new(d));
                } else {
                    iov.push(IoSlice::new(&d[skip - HDR..]));
                }
            }
            match server.write_vectored(&iov) {
                Ok(n) => {
                    let done = (partial + n) / resp;
                    partial = (partial + n) % resp;
                    owed -= done;
                    k = (k + done) % bufs;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Ok(thread_cpu() - c0)
                }
                Err(e) => return Err(e),
            }
        }
    });
    pin(1);
    let resp = HDR + size;
    let req = vec![0u8; REQ * qd];
    let mut rb = vec![0u8; 256 << 10];
    // Request bytes owed to the socket; bytes of a response read in part.
    let (mut unsent, mut carry, mut done) = (REQ * qd, 0usize, 0u64);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let mut spins = 0u64;
    loop {
        if unsent > 0 {
            match client.write(&req[..unsent.min(req.len())]) {
                Ok(n) => unsent -= n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        match client.read(&mut rb) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                let c = (carry + n) / resp;
                carry = (carry + n) % resp;
                done += c as u64;
                unsent += c * REQ;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        spins += 1;
        if spins.is_multiple_of(64) && Instant::now() >= end {
            break;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    drop(client);
    let cpu = match responder.join() {
        Ok(r) => r?,
        Err(_) => return Err(std::io::Error::other("responder panicked")),
    };
    let per_s = done as f64 / el;
    if json {
        println!(
            "{{\"ios_per_s\": {per_s:.0}, \"responder_cpu\": {:.3}}}",
            cpu.as_secs_f64() / el
        );
    } else {
        println!(
            "QD {qd}: 72 B requests, 24 B + {size} B responses, both polling: {:.1} K/s; responder {:.2} cores",
            per_s / 1e3,
            cpu.as_secs_f64() / el
        );
    }
    Ok(())
}

/// `--empty-poll`: ns per receive that finds nothing, `recv` against a
/// one-iovec `readv`, interleaved in rounds of 500,000 on core 0; the
/// median of 5 rounds each.
fn empty_polls(json: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let _client = TcpStream::connect(l.local_addr()?)?;
    let (server, _) = l.accept()?;
    server.set_nonblocking(true)?;
    pin(0);
    let fd = server.as_raw_fd();
    let mut b = vec![0u8; 64 << 10];
    const N: u32 = 500_000;
    let (mut recv, mut readv) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..N {
            // SAFETY: `b` is writable for its length during the call.
            let r = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            assert!(r < 0, "nothing was sent");
        }
        recv.push(t.elapsed().as_nanos() as f64 / N as f64);
        let t = Instant::now();
        for _ in 0..N {
            let iov = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
            // SAFETY: the iovec describes `b`, writable during the call.
            let r = unsafe { libc::readv(fd, &iov, 1) };
            assert!(r < 0, "nothing was sent");
        }
        readv.push(t.elapsed().as_nanos() as f64 / N as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (r, v) = (med(&mut recv), med(&mut readv));
    if json {
        println!("{{\"recv_ns\": {r:.1}, \"readv_ns\": {v:.1}}}");
    } else {
        println!("an empty receive: recv {r:.0} ns, readv {v:.0} ns (median of 5 rounds of {N})");
    }
    Ok(())
}
