//! The host transport against a real NVMe/TCP controller: Linux's
//! nvmet-tcp in tests/guest (tcp.sh), or any other. Runs only when
//! `POLLUX_TCP_PEER` names it as `ADDR:PORT/SUBNQN`; otherwise every test
//! returns at once (and says so).
use std::net::SocketAddr;

use pollux_nvme::ControllerOptions;
use pollux_spec::log::{lid, CommandEffectsLog, SmartLog};
use pollux_tcp::{Controller, TcpOptions};
use zerocopy::FromBytes;

fn peer() -> Option<(SocketAddr, String)> {
    let v = match std::env::var("POLLUX_TCP_PEER") {
        Ok(v) if !v.is_empty() => v,
        _ => {
            eprintln!("POLLUX_TCP_PEER not set: skipping (runs in tests/guest)");
            return None;
        }
    };
    let (addr, nqn) = v
        .split_once('/')
        .unwrap_or_else(|| panic!("POLLUX_TCP_PEER={v}: expected ADDR:PORT/SUBNQN"));
    let addr = addr
        .parse()
        .unwrap_or_else(|e| panic!("POLLUX_TCP_PEER={v}: {addr}: {e}"));
    Some((addr, nqn.to_string()))
}

fn open(addr: SocketAddr, nqn: &str) -> Controller {
    pollux_tcp::open(TcpOptions::new(addr, nqn), ControllerOptions::default())
        .unwrap_or_else(|e| panic!("bring-up of {addr} {nqn}: {e}"))
}

/// Get Log Page at lengths a controller must answer in full, the log
/// shorter than the length asked for included (the Firmware Slot log is
/// 512 bytes, read as 4 KiB: Linux's nvmet sends the whole 4 KiB, zeros;
/// so does pollux target): every call succeeds with the length asked
/// for, zeros past the end of a log. Linux's nvmet answers SMART only at
/// its exact size (512 bytes).
#[test]
fn log_pages_at_the_lengths_asked_for() {
    let Some((addr, nqn)) = peer() else { return };
    let c = open(addr, &nqn);
    let lpa = c.identify().lpa;
    let smart = c
        .get_log_page(lid::SMART, 0xFFFF_FFFF, 512)
        .expect("SMART, 512 bytes");
    assert_eq!(smart.len(), 512);
    let s = SmartLog::read_from_bytes(&smart).unwrap();
    assert!(
        s.temperature() < 400,
        "composite temperature {} K",
        s.temperature()
    );
    for (l, len) in [
        (lid::ERROR, 64),
        (lid::ERROR, 4096),
        (lid::FIRMWARE_SLOT, 4096),
    ] {
        let d = c
            .get_log_page(l, 0, len)
            .unwrap_or_else(|e| panic!("LID {l:#x}, {len} bytes: {e}"));
        assert_eq!(d.len(), len, "LID {l:#x}");
        if l == lid::FIRMWARE_SLOT {
            assert!(d[512..].iter().all(|&b| b == 0), "zeros past the log");
        }
    }
    if lpa & pollux_spec::identify::LPA_COMMANDS_EFFECTS != 0 {
        let d = c
            .get_log_page(lid::COMMANDS_SUPPORTED, 0, 4096)
            .expect("Commands Supported and Effects");
        let e = CommandEffectsLog::read_from_bytes(&d).unwrap();
        // Read (02h) and Identify (06h) are supported everywhere.
        assert_ne!(e.iocs[0x02] & 1, 0, "Read supported");
        assert_ne!(e.acs[0x06] & 1, 0, "Identify supported");
    } else {
        eprintln!("LPA bit 1 clear: no Commands Supported and Effects log");
    }
}
