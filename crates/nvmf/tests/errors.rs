//! Failed I/O commands reach the controller's Error Information log and
//! SMART / Health media error count, read over the admin queue: the I/O
//! queue runs on a runtime thread, apart from the admin queue.
mod common;

use common::*;
use pollux_bdev::Bdev;
use pollux_nvmf::{RuntimeOptions, SubsystemConfig, Target, TargetConfig};
use pollux_spec::features::fid;
use pollux_spec::log::{lid, ErrorLogEntry, SmartLog};
use pollux_spec::status::{generic, media, sct};
use pollux_spec::tcp::Digests;
use pollux_spec::{NvmOpcode, Sqe};
use zerocopy::FromBytes;

fn log_page(c: &mut Client, lid: u8, len: u32) -> Vec<u8> {
    let (data, cq) = c.data_cmd(Sqe::get_log_page(lid, 0, len, 0, 0, 0), len);
    if let Some(cq) = cq {
        assert!(cq.status().is_success(), "Get Log Page {lid}");
    }
    data
}

fn error_log(c: &mut Client) -> Vec<ErrorLogEntry> {
    log_page(c, lid::ERROR, 64 * 64)
        .chunks_exact(64)
        .map(|e| ErrorLogEntry::read_from_bytes(e).unwrap())
        .take_while(|e| e.error_count != 0)
        .collect()
}

fn smart(c: &mut Client) -> SmartLog {
    SmartLog::read_from_bytes(&log_page(c, lid::SMART, 512)).unwrap()
}

#[test]
fn failed_io_commands_show_in_the_error_log_and_smart() {
    let bdev: Bdev = Bdev::ram("Malloc0", 512, 4096).unwrap();
    let mut cfg = TargetConfig::default();
    cfg.bdevs.push(bdev.clone());
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    let t = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    let addr = t.listen_addrs()[0];

    let dg = Digests::default();
    let mut a = Client::connect(addr);
    a.ic(dg);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 1 << 16 | 1);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    assert!(error_log(&mut a).is_empty());
    assert_eq!(smart(&mut a).media_errors(), 0);

    let mut q = Client::io_queue(addr, dg, cntlid, 1, HOST_A, false);
    assert!(q.write(1, 8, &pattern(4096, 1), true).status().is_success());
    // A read beyond the namespace: refused by the checks (generic).
    let mut bad = Sqe::rw(NvmOpcode::Read, 1, 4096, 1);
    bad.cid = 0x77;
    q.capsule(&bad, &[]);
    let r = q.resp();
    assert!(r.status().is(sct::GENERIC, generic::LBA_OUT_OF_RANGE));
    // The namespace's storage fails: a write (in the capsule) then a read.
    assert!(bdev.inject_failure());
    let r = q.write(1, 16, &pattern(4096, 2), true);
    assert!(r.status().is(sct::MEDIA, media::WRITE_FAULT), "{r:?}");
    let wcid = r.cid;
    let (_, r) = q.read(1, 24, 4096);
    let r = r.expect("a failed read ends in a response capsule");
    assert!(r.status().is(sct::MEDIA, media::UNRECOVERED_READ_ERROR));
    let rcid = r.cid;

    let s = smart(&mut a);
    assert_eq!(s.media_errors(), 2);
    assert_eq!(s.num_err_log_entries(), 3);
    let log = error_log(&mut a);
    let got: Vec<(u64, u16, u16, u32, u64, u16)> = log
        .iter()
        .map(|e| (e.error_count, e.sqid, e.cid, e.nsid, e.lba, e.status().0))
        .collect();
    // Newest first, with the I/O queue's QID (1), the command's CID and
    // LBA.
    assert_eq!(
        got,
        [
            (3, 1, rcid, 1, 24, r.status().0),
            (
                2,
                1,
                wcid,
                1,
                16,
                pollux_spec::Status::media(media::WRITE_FAULT).0
            ),
            (
                1,
                1,
                0x77,
                1,
                4096,
                pollux_spec::Status::generic(generic::LBA_OUT_OF_RANGE).0
            ),
        ]
    );
}
