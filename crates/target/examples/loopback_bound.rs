//! What the kernel alone moves over loopback TCP: a bare sender on core 0
//! writes what a target sends for 4 KiB reads (a 24-byte C2HData header
//! and 4 KiB of data per PDU, `--batch` PDUs per `writev`) and a bare
//! receiver on core 1 reads them into a 256 KiB buffer. No parsing, no
//! commands, no requests the other way: an upper bound for any NVMe/TCP
//! target on one core of this machine with this kernel (its figure is
//! what `bench/tcp.sh` compares the target with).
//!
//! `cargo run --release -p pollux-target --example loopback_bound --
//! [--batch N] [--bufs N] [--size BYTES] [--secs S] [--json]`
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // within it; sched_setaffinity reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("loopback_bound: cannot pin to core {core}; running unpinned");
        }
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
