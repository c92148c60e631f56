//! Delete I/O Submission Queue under pressure: a hostile host binds many
//! full SQs to one tiny CQ, never lets the device fetch (the CQ is full),
//! and deletes them all. Every command must still complete exactly once
//! (Command Aborted due to SQ Deletion), the CQ must never overflow, and no
//! Delete may complete before all of its SQ's completions are in the CQ.
mod common;

use std::collections::BTreeMap;

use common::*;
use pollux_spec::regs::sq_tail_doorbell;
use pollux_spec::status::{generic, sct, specific};
use pollux_spec::Sqe;

/// Enough unfetched commands (20 x 4095) to exceed any backlog sized for
/// "normal" operation many times over.
const SQS: u16 = 20;
const SQ_ENTRIES: u32 = 4096;
const CQ_ENTRIES: u32 = 2;

#[test]
fn deleting_many_full_sqs_on_a_tiny_cq_loses_nothing() {
    let mut h = Host::enabled(cfg_ram());
    let (cq_iova, cq_ptr) = h.alloc(CQ_ENTRIES as usize * 16);
    let st = h.admin_status(Sqe::create_io_cq(1, CQ_ENTRIES as u16, cq_iova));
    assert!(st.is_success(), "create cq: {st}");
    let mut cq = CqRing {
        qid: 1,
        iova: cq_iova,
        ptr: cq_ptr.cast(),
        size: CQ_ENTRIES,
        head: 0,
        phase: true,
    };
    for qid in 1..=SQS {
        let (iova, ptr) = h.alloc(SQ_ENTRIES as usize * 64);
        let st = h.admin_status(Sqe::create_io_sq(qid, SQ_ENTRIES as u16, 1, iova));
        assert!(st.is_success(), "create sq {qid}: {st}");
        let mut sq = SqRing {
            qid,
            iova,
            ptr: ptr.cast(),
            size: SQ_ENTRIES,
            tail: 0,
        };
        // Fill the SQ completely; CIDs are unique per SQ.
        for i in 0..SQ_ENTRIES - 1 {
            let mut s = Sqe::flush(1);
            s.cid = i as u16;
            Host::push(&mut sq, s);
        }
        h.w32(sq_tail_doorbell(qid, 0), sq.tail);
    }
    // The device fetches until the CQ is full and stops: the SQs stay full.
    h.steps(8);
    // Delete every SQ (the admin SQ and CQ have 32 entries).
    let mut delete_cid = BTreeMap::new();
    for qid in 1..=SQS {
        delete_cid.insert(h.admin_submit(Sqe::delete_io_sq(qid)), qid);
    }
    h.steps(8);
    // Nothing can be posted while the host does not consume the CQ, so no
    // deletion can have finished, and the CQ cannot be deleted under them.
    assert!(
        !Host::peek(&h.acq),
        "a Delete I/O SQ completed before its aborted commands were posted"
    );
    let del_cq = h.admin_submit(Sqe::delete_io_cq(1));
    let c = h.wait_admin(10).expect("Delete I/O CQ completion");
    assert_eq!(c.cid, del_cq);
    assert!(
        c.status()
            .is(sct::COMMAND_SPECIFIC, specific::INVALID_QUEUE_DELETION),
        "Delete I/O CQ with deletions pending: {}",
        c.status()
    );

    // Now consume: every command completes exactly once, every Delete
    // succeeds, and only after all of its SQ's completions were posted.
    let per_sq = SQ_ENTRIES as usize - 1;
    let mut seen: BTreeMap<u16, Vec<u8>> = (1..=SQS).map(|q| (q, vec![0; per_sq])).collect();
    let mut received: BTreeMap<u16, usize> = BTreeMap::new();
    let mut deleted = 0;
    let total = SQS as usize * per_sq;
    let mut got = 0;
    for _ in 0..4 * total {
        h.step();
        let old = cq.head;
        while let Some(c) = Host::take(&mut cq) {
            let slot = seen
                .get_mut(&c.sqid)
                .and_then(|v| v.get_mut(c.cid as usize))
                .unwrap_or_else(|| panic!("completion for unknown command {c:?}"));
            *slot += 1;
            assert_eq!(*slot, 1, "command completed twice: {c:?}");
            let fetched_before_delete = c.sqid == 1 && c.cid < 2;
            if fetched_before_delete {
                assert!(c.status().is_success(), "{c:?}");
            } else {
                assert!(
                    c.status().is(sct::GENERIC, generic::ABORTED_SQ_DELETION),
                    "{c:?}: {}",
                    c.status()
                );
            }
            *received.entry(c.sqid).or_default() += 1;
            got += 1;
        }
        h.ring_cq(&cq, old);
        while let Some(c) = Host::take(&mut h.acq) {
            let qid = delete_cid
                .remove(&c.cid)
                .unwrap_or_else(|| panic!("unexpected admin completion {c:?}"));
            assert!(c.status().is_success(), "delete sq {qid}: {}", c.status());
            assert_eq!(
                received.get(&qid).copied().unwrap_or(0),
                per_sq,
                "Delete I/O SQ {qid} completed before all its commands"
            );
            deleted += 1;
        }
        h.w32(pollux_spec::regs::cq_head_doorbell(0, 0), h.acq.head);
        if deleted == SQS && got == total {
            break;
        }
    }
    assert_eq!(got, total, "completions lost");
    assert_eq!(deleted, SQS, "deletions never completed");
    assert!(seen.values().all(|v| v.iter().all(|&n| n == 1)));
    h.steps(8);
    assert!(!Host::peek(&cq), "stray completion after all deletions");
    check_success(h.admin_status(Sqe::delete_io_cq(1)));
}

#[track_caller]
fn check_success(s: pollux_spec::Status) {
    assert!(s.is_success(), "{s}");
}

/// Commands in progress (delayed by fault injection) are aborted into a CQ
/// with room for one entry: the Delete completes only once the host has
/// been given every one of them.
#[test]
fn deletion_waits_for_aborted_commands_in_the_backlog() {
    use pollux_softnvme::{FaultAction, FaultRule, QueueSel};
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq_irq(1, 2, None);
    // Two-entry SQ and CQ: keep submitting one at a time.
    h.dev.add_fault(FaultRule::new(
        QueueSel::Io,
        FaultAction::Delay(std::time::Duration::from_secs(3600)),
    ));
    let mut cids = Vec::new();
    for _ in 0..8 {
        cids.push(h.submit(&mut q, Sqe::flush(1)));
        h.steps(2);
    }
    assert!(!Host::peek(&q.cq), "delayed commands completed early");
    let del = h.admin_submit(Sqe::delete_io_sq(1));
    h.steps(4);
    assert!(
        !Host::peek(&h.acq),
        "Delete completed with aborted commands still unposted"
    );
    let mut aborted = Vec::new();
    let mut deleted = None;
    for _ in 0..100 {
        h.step();
        let old = q.cq.head;
        while let Some(c) = Host::take(&mut q.cq) {
            assert!(
                c.status().is(sct::GENERIC, generic::ABORTED_SQ_DELETION),
                "{c:?}"
            );
            aborted.push(c.cid);
        }
        h.ring_cq(&q.cq, old);
        // The Delete's completion is checked after draining the I/O CQ in
        // the same round: it may only be posted once every abort is in it.
        if let Some(c) = Host::take(&mut h.acq) {
            h.w32(pollux_spec::regs::cq_head_doorbell(0, 0), h.acq.head);
            assert_eq!(c.cid, del);
            assert!(c.status().is_success(), "{}", c.status());
            deleted = Some(aborted.len());
            break;
        }
    }
    assert_eq!(deleted, Some(cids.len()), "Delete before all aborts");
    aborted.sort_unstable();
    cids.sort_unstable();
    assert_eq!(aborted, cids);
    check_success(h.admin_status(Sqe::delete_io_cq(1)));
}
