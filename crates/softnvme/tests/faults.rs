//! Fault injection: every FaultAction, rule matching (skip/count/LBA/queue)
//! and recovery by controller reset.
mod common;

use std::time::{Duration, Instant};

use common::*;
use pollux_softnvme::{FaultAction, FaultRule, QueueSel, SoftConfig};
use pollux_spec::cmd::cns;
use pollux_spec::log::{lid, SmartLog};
use pollux_spec::status::{generic, media, sct, specific};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

fn read_rule(action: FaultAction) -> FaultRule {
    FaultRule {
        opcode: Some(NvmOpcode::Read as u8),
        ..FaultRule::new(QueueSel::Io, action)
    }
}

fn setup() -> (Host, IoQ, u64) {
    let mut h = Host::enabled(cfg_ram());
    let q = h.create_ioq(1, 16);
    let (b, _) = h.alloc(4096);
    (h, q, b)
}

#[test]
fn status_fault_with_skip_and_count() {
    let (mut h, mut q, b) = setup();
    h.write_mem(b, &[1; 4096]);
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Write, 2, 0, 1, b, 0))
        .is_success());
    h.dev.add_fault(FaultRule {
        skip: 1,
        count: Some(2),
        nsid: Some(2),
        ..read_rule(FaultAction::Status(Status::media(
            media::UNRECOVERED_READ_ERROR,
        )))
    });
    h.write_mem(b, &[0; 4096]);
    let sts: Vec<Status> = (0..4)
        .map(|_| h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, b, 0)))
        .collect();
    assert!(sts[0].is_success());
    assert!(sts[1].is(sct::MEDIA, media::UNRECOVERED_READ_ERROR));
    assert!(sts[2].is(sct::MEDIA, media::UNRECOVERED_READ_ERROR));
    assert!(sts[3].is_success());
    // Other namespace / opcode untouched.
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0))
        .is_success());
    assert_eq!(h.dev.stats().faults_fired, 2);
    let (lb, _) = h.alloc(512);
    h.admin_status(Sqe::get_log_page(lid::SMART, 0, 512, 0, lb, 0));
    let smart = SmartLog::read_from_bytes(&h.read_mem(lb, 512)).unwrap();
    assert_eq!(smart.media_errors(), 2);
}

#[test]
fn status_fault_moves_no_data() {
    let (mut h, mut q, b) = setup();
    h.write_mem(b, &[9; 4096]);
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Write, 2, 0, 1, b, 0))
        .is_success());
    h.dev
        .add_fault(read_rule(FaultAction::Status(Status::generic(
            generic::INTERNAL_ERROR,
        ))));
    h.write_mem(b, &[0; 4096]);
    let s = h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, b, 0));
    assert!(s.is(sct::GENERIC, generic::INTERNAL_ERROR));
    assert!(h.read_mem(b, 4096).iter().all(|&x| x == 0));
    h.dev.clear_faults();
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, b, 0))
        .is_success());
    assert!(h.read_mem(b, 4096).iter().all(|&x| x == 9));
}

#[test]
fn lba_range_and_admin_rules() {
    let (mut h, mut q, b) = setup();
    h.dev.add_fault(FaultRule {
        lba: Some(100..108),
        ..FaultRule::new(
            QueueSel::Any,
            FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
        )
    });
    h.dev.add_fault(FaultRule {
        opcode: Some(AdminOpcode::Identify as u8),
        count: Some(1),
        ..FaultRule::new(
            QueueSel::Admin,
            FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
        )
    });
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 92, 8, b, 0))
        .is_success());
    assert!(!h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 99, 2, b, 0))
        .is_success());
    assert!(!h
        .io_status(&mut q, rw(NvmOpcode::Write, 1, 107, 1, b, 0))
        .is_success());
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 108, 1, b, 0))
        .is_success());
    assert!(h.io_status(&mut q, Sqe::flush(1)).is_success());
    assert!(!h
        .admin_status(Sqe::identify(cns::CONTROLLER, 0, b))
        .is_success());
    assert!(h
        .admin_status(Sqe::identify(cns::CONTROLLER, 0, b))
        .is_success());
}

#[test]
fn delay_posts_no_earlier() {
    let (mut h, mut q, b) = setup();
    let d = Duration::from_millis(30);
    h.dev.add_fault(FaultRule {
        count: Some(1),
        ..read_rule(FaultAction::Delay(d))
    });
    let t0 = Instant::now();
    let cid = h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(5);
    assert!(!Host::peek(&q.cq) || t0.elapsed() >= d);
    let c = loop {
        h.step();
        let old = q.cq.head;
        if let Some(c) = Host::take(&mut q.cq) {
            h.ring_cq(&q.cq, old);
            break c;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "delayed completion never came"
        );
        std::thread::yield_now();
    };
    assert!(t0.elapsed() >= d);
    assert_eq!(c.cid, cid);
    assert!(c.status().is_success());
    // Other commands are not held behind it.
    h.dev.add_fault(FaultRule {
        count: Some(1),
        ..read_rule(FaultAction::Delay(Duration::from_secs(60)))
    });
    let slow = h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    let fast = h.io(&mut q, rw(NvmOpcode::Write, 1, 0, 1, b, 0));
    assert_ne!(fast.cid, slow);
    // SQ deletion completes the delayed command as aborted.
    assert!(h.admin_status(Sqe::delete_io_sq(1)).is_success());
    let c = Host::take(&mut q.cq).expect("aborted delayed command");
    assert_eq!(c.cid, slow);
    assert!(c.status().is(sct::GENERIC, generic::ABORTED_SQ_DELETION));
}

#[test]
fn drop_then_abort() {
    let (mut h, mut q, b) = setup();
    h.dev.add_fault(FaultRule {
        count: Some(1),
        ..read_rule(FaultAction::Drop)
    });
    let cid = h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(10);
    assert!(!Host::peek(&q.cq), "dropped command completed");
    let c = h.admin(Sqe::abort(1, cid));
    assert!(c.status().is_success());
    assert_eq!(c.dw0 & 1, 0);
    let c = h.wait_io(&mut q, 5).expect("aborted command completion");
    assert_eq!(c.cid, cid);
    assert!(c.status().is(sct::GENERIC, generic::ABORT_REQUESTED));
    // Aborting it again finds nothing.
    assert_eq!(h.admin(Sqe::abort(1, cid)).dw0 & 1, 1);
}

#[test]
fn dropped_commands_are_forgotten_by_sq_deletion_and_reset() {
    let (mut h, mut q, b) = setup();
    h.dev.add_fault(read_rule(FaultAction::Drop));
    h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(3);
    assert!(h.admin_status(Sqe::delete_io_sq(1)).is_success());
    h.steps(3);
    assert!(!Host::peek(&q.cq));
    let mut q = {
        assert!(h.admin_status(Sqe::delete_io_cq(1)).is_success());
        h.create_ioq(1, 16)
    };
    h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(3);
    h.set_enable(false);
    h.set_enable(true);
    h.dev.clear_faults();
    let mut q = h.create_ioq(1, 16);
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0))
        .is_success());
    assert!(!Host::peek(&q.cq));
}

#[test]
fn reorder_posts_after_next_completion() {
    let (mut h, mut q, b) = setup();
    h.dev.add_fault(FaultRule {
        count: Some(1),
        ..read_rule(FaultAction::Reorder)
    });
    let a = h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(3);
    assert!(!Host::peek(&q.cq), "held completion posted alone");
    let bcid = h.submit(&mut q, rw(NvmOpcode::Write, 1, 0, 1, b, 0));
    h.step();
    let first = Host::take(&mut q.cq).unwrap();
    let second = Host::take(&mut q.cq).unwrap();
    assert_eq!((first.cid, second.cid), (bcid, a));
    assert!(first.status().is_success() && second.status().is_success());
}

#[test]
fn abort_limit() {
    let mut h = Host::enabled(SoftConfig {
        abort_limit: 0,
        ..cfg_ram()
    });
    // Delay every Abort so one stays in flight.
    h.dev.add_fault(FaultRule {
        opcode: Some(AdminOpcode::Abort as u8),
        count: Some(1),
        ..FaultRule::new(QueueSel::Admin, FaultAction::Delay(Duration::from_secs(60)))
    });
    let first = h.admin_submit(Sqe::abort(1, 5));
    let c = h.admin(Sqe::abort(1, 6));
    assert_ne!(c.cid, first);
    assert!(
        c.status()
            .is(sct::COMMAND_SPECIFIC, specific::ABORT_LIMIT_EXCEEDED),
        "{}",
        c.status()
    );
}

fn stuck_then_reset(action: FaultAction, expect_cfs: bool) {
    let (mut h, mut q, b) = setup();
    h.dev.add_fault(FaultRule {
        count: Some(1),
        ..read_rule(action)
    });
    h.submit(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0));
    h.steps(3);
    assert_eq!(h.csts().cfs(), expect_cfs);
    assert!(h.csts().rdy());
    assert!(!Host::peek(&q.cq));
    // Nothing is processed any more: neither I/O nor admin.
    h.submit(&mut q, rw(NvmOpcode::Write, 1, 0, 1, b, 0));
    h.admin_submit(Sqe::identify(cns::CONTROLLER, 0, b));
    assert!(h.wait_admin(10).is_none());
    assert!(!Host::peek(&q.cq));
    // A controller reset recovers.
    let c = h.set_enable(false);
    assert!(!c.cfs() && !c.rdy());
    let c = h.set_enable(true);
    assert!(c.rdy() && !c.cfs());
    let mut q = h.create_ioq(1, 16);
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0))
        .is_success());
}

#[test]
fn fatal_sets_cfs_until_reset() {
    stuck_then_reset(FaultAction::Fatal, true);
}

#[test]
fn freeze_stops_without_cfs_until_reset() {
    stuck_then_reset(FaultAction::Freeze, false);
}
