//! The two ends of the engine against each other in memory: a host queue
//! and a small controller on a target queue, the bytes between them cut
//! wherever a test (or proptest) likes.
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;

use pollux_spec::status::generic;
use pollux_spec::tcp::{
    flags, C2HData, CapsuleResp, Digests, Fes, Field, PduLayout, PduType, Role, TermReq, R2T,
};
use pollux_spec::{Cqe, NvmOpcode, Sqe, Status};
use proptest::prelude::*;
use zerocopy::{FromBytes, IntoBytes};

use crate::engine::host::{Data, HostErrorKind, HostQueue};
use crate::engine::ic::{self, HostParams, TargetLimits};
use crate::engine::memory::Pointers;
use crate::engine::target::{Ended, TargetError, TargetEvent, TargetQueue};
use crate::engine::tx::SendQueue;

const BS: usize = 512;
const BLOCKS: usize = 256;
const SLOTS: usize = 32;

fn addr() -> SocketAddr {
    "127.0.0.1:4420".parse().unwrap()
}

/// Everything queued in `q`, as it would go on the wire, then dropped.
fn drain(q: &mut SendQueue, marks: &mut Vec<u16>) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut iov = [IoSlice::new(&[]); 8];
        // SAFETY: every Ext segment names a buffer the test keeps alive
        // and unwritten until its mark (target) or completion (host).
        let n = unsafe { q.iovecs(&Pointers, &mut iov) };
        let mut sent = 0;
        for v in &iov[..n] {
            out.extend_from_slice(v);
            sent += v.len();
        }
        q.advance(sent, |m| marks.push(m));
        if n == 0 || q.is_empty() {
            break;
        }
    }
    out
}

/// A small NVM controller on a target queue: a RAM namespace; reads as
/// C2HData PDUs of `c2h_chunk` bytes (with SUCCESS, or a response capsule
/// when `flow`); writes in-capsule or through one R2T per command.
struct Ctl {
    q: TargetQueue,
    store: Vec<u8>,
    c2h_chunk: u32,
    flow: bool,
    /// The capsule whose data is arriving, and its data.
    capsule: Option<(Sqe, Vec<u8>)>,
    /// Writes waiting for H2CData, by TTAG: the command and its buffer.
    writes: HashMap<u16, (Sqe, Vec<u8>)>,
    /// The transfer whose H2CData is arriving, and where its data starts.
    h2c: Option<(u16, u32)>,
    /// Read buffers on the wire, by TTAG, until their mark.
    sending: HashMap<u16, Vec<u8>>,
    next_ttag: u16,
    /// Every H2CData PDU received: (TTAG, DATAO, DATAL).
    h2c_seen: Vec<(u16, u32, u32)>,
    initialized: bool,
    terminated: Option<(Fes, u32)>,
}

impl Ctl {
    fn new(maxh2cdata: u32, c2h_chunk: u32, flow: bool) -> Ctl {
        let store = (0..BS * BLOCKS).map(|i| (i * 7 + i / 512) as u8).collect();
        Ctl {
            q: TargetQueue::new(
                TargetLimits {
                    maxh2cdata,
                    icd: 8192,
                },
                SLOTS,
            ),
            store,
            c2h_chunk,
            flow,
            capsule: None,
            writes: HashMap::new(),
            h2c: None,
            sending: HashMap::new(),
            next_ttag: 0,
            h2c_seen: Vec::new(),
            initialized: false,
            terminated: None,
        }
    }

    fn range(sqe: &Sqe) -> (usize, usize) {
        let lba = sqe.cdw10 as usize | (sqe.cdw11 as usize) << 32;
        let nlb = (sqe.cdw12 & 0xFFFF) as usize + 1;
        (lba * BS, nlb * BS)
    }

    fn ok(cid: u16) -> Cqe {
        Cqe {
            cid,
            ..Cqe::default()
        }
    }

    /// Feeds `input` (all of it is consumed or kept by the caller).
    fn feed(&mut self, input: &[u8]) -> Result<usize, TargetError> {
        let mut at = 0;
        loop {
            let (used, ev) = self.q.next(&input[at..])?;
            at += used;
            let Some(ev) = ev else { return Ok(at) };
            self.event(ev);
        }
    }

    fn event(&mut self, ev: TargetEvent<'_>) {
        match ev {
            TargetEvent::Initialized(_) => self.initialized = true,
            TargetEvent::TermReq(t) => self.terminated = Some((t.fes(), t.fei())),
            TargetEvent::Capsule {
                sqe,
                data_len,
                data,
                end,
            } => {
                self.capsule = Some((sqe, Vec::with_capacity(data_len as usize)));
                if let Some(d) = data {
                    self.event(TargetEvent::Data {
                        offset: 0,
                        bytes: d,
                        end,
                    });
                }
            }
            TargetEvent::H2CData {
                ttag,
                datao,
                datal,
                data,
                end,
            } => {
                self.h2c_seen.push((ttag, datao, datal));
                self.h2c = Some((ttag, datao));
                if let Some(d) = data {
                    self.event(TargetEvent::Data {
                        offset: 0,
                        bytes: d,
                        end,
                    });
                }
            }
            TargetEvent::Data { offset, bytes, end } => {
                if let Some((_, d)) = &mut self.capsule {
                    assert_eq!(d.len(), offset as usize);
                    d.extend_from_slice(bytes);
                } else if let Some((ttag, datao)) = self.h2c {
                    let (_, buf) = self.writes.get_mut(&ttag).expect("write");
                    let o = (datao + offset) as usize;
                    buf[o..o + bytes.len()].copy_from_slice(bytes);
                }
                if let Some(e) = end {
                    self.ended(e);
                }
            }
            TargetEvent::End(e) => self.ended(e),
        }
    }

    fn ended(&mut self, e: Ended) {
        match e {
            Ended::Capsule { digest_ok } => {
                let (sqe, data) = self.capsule.take().expect("capsule");
                if digest_ok {
                    self.command(sqe, &data);
                } else {
                    let st = Status::generic(generic::TRANSIENT_TRANSPORT_ERROR);
                    self.q.respond(
                        Cqe {
                            status: st.0 << 1,
                            ..Self::ok(sqe.cid)
                        },
                        None,
                    );
                }
            }
            Ended::H2C {
                ttag,
                digest_ok,
                complete,
            } => {
                self.h2c = None;
                assert!(digest_ok);
                if complete {
                    let (sqe, buf) = self.writes.remove(&ttag).expect("write");
                    let (at, _) = Self::range(&sqe);
                    self.store[at..at + buf.len()].copy_from_slice(&buf);
                    self.q.respond(Self::ok(sqe.cid), None);
                }
            }
            Ended::Other => {}
        }
    }

    fn command(&mut self, sqe: Sqe, icd: &[u8]) {
        let (at, len) = Self::range(&sqe);
        match sqe.opc {
            o if o == NvmOpcode::Read as u8 => {
                let ttag = self.ttag();
                let buf = self.store[at..at + len].to_vec();
                let resp = self.flow.then(|| Self::ok(sqe.cid));
                // SAFETY: the buffer stays in `sending` (its heap memory
                // unmoved) until its mark is reached.
                let ok = unsafe { self.q.send_data(sqe.cid, &buf, self.c2h_chunk, resp, ttag) };
                assert!(ok);
                self.sending.insert(ttag, buf);
            }
            o if o == NvmOpcode::Write as u8 && !icd.is_empty() => {
                self.store[at..at + icd.len()].copy_from_slice(icd);
                self.q.respond(Self::ok(sqe.cid), None);
            }
            o if o == NvmOpcode::Write as u8 => {
                let ttag = self.ttag();
                self.writes.insert(ttag, (sqe, vec![0; len]));
                self.q.r2t(ttag, sqe.cid, len as u32);
            }
            _ => self.q.respond(Self::ok(sqe.cid), None),
        }
    }

    fn ttag(&mut self) -> u16 {
        self.next_ttag = (self.next_ttag + 1) % SLOTS as u16;
        self.next_ttag
    }

    /// What the controller sends, with read buffers freed at their marks.
    fn out(&mut self) -> Vec<u8> {
        let mut marks = Vec::new();
        let out = drain(&mut self.q.tx, &mut marks);
        for m in marks {
            self.sending.remove(&m);
        }
        out
    }
}

/// A host queue and a controller, connected through ICReq/ICResp.
struct Pair {
    host: HostQueue<Pointers>,
    ctl: Ctl,
    /// Bytes on the wire to each side, and bytes each side received and
    /// has not consumed yet (its receive buffer).
    to_ctl: Vec<u8>,
    to_host: Vec<u8>,
    ctl_rx: Vec<u8>,
    host_rx: Vec<u8>,
    /// Completions: (tag, status, bounce data).
    done: Vec<(u16, u16, Vec<u8>)>,
}

impl Pair {
    fn new(digests: Digests, maxh2cdata: u32, c2h_chunk: u32, flow: bool, icd: u32) -> Pair {
        let mut ctl = Ctl::new(maxh2cdata, c2h_chunk, flow);
        let req = ic::host_icreq(digests);
        assert_eq!(ctl.feed(req.as_bytes()).unwrap(), 128);
        assert!(ctl.initialized);
        let resp = ctl.out();
        assert_eq!(ic::host_first_pdu_len(&resp[..8]).unwrap(), 128);
        let params = ic::host_icresp(&resp, digests).unwrap();
        assert_eq!(
            params,
            HostParams {
                digests,
                cpda: 0,
                maxh2cdata
            }
        );
        let mut host = HostQueue::new(Pointers, addr(), 1, params, SLOTS);
        host.icd_max = icd;
        Pair {
            host,
            ctl,
            to_ctl: Vec::new(),
            to_host: Vec::new(),
            ctl_rx: Vec::new(),
            host_rx: Vec::new(),
            done: Vec::new(),
        }
    }

    /// Moves bytes both ways until all is delivered and consumed, each
    /// receive taking the next size `cuts` gives (cycled) off the wire.
    fn run(&mut self, cuts: &[usize]) {
        let mut k = 0;
        for _ in 0..1_000_000 {
            self.to_ctl
                .extend(drain(&mut self.host.tx, &mut Vec::new()));
            if !self.to_ctl.is_empty() {
                let n = cuts[k % cuts.len()].clamp(1, self.to_ctl.len());
                k += 1;
                self.ctl_rx.extend(self.to_ctl.drain(..n));
                let used = self.ctl.feed(&self.ctl_rx).expect("controller");
                self.ctl_rx.drain(..used);
            }
            self.to_host.extend(self.ctl.out());
            if !self.to_host.is_empty() {
                let n = cuts[k % cuts.len()].clamp(1, self.to_host.len());
                k += 1;
                self.host_rx.extend(self.to_host.drain(..n));
                let done = &mut self.done;
                let r = self
                    .host
                    .receive(&self.host_rx, u32::MAX, &mut |_, s, cqe| {
                        done.push((s.tag, cqe.status >> 1, std::mem::take(&mut s.bounce)));
                    });
                assert!(!r.failed, "{:?}", self.host.take_error());
                self.host_rx.drain(..r.consumed);
            }
            if self.to_ctl.is_empty()
                && self.to_host.is_empty()
                && self.host.tx.is_empty()
                && self.ctl.q.tx.is_empty()
            {
                assert!(self.ctl_rx.is_empty(), "controller left {:?}", self.ctl_rx);
                assert!(self.host_rx.is_empty(), "host left {:?}", self.host_rx);
                return;
            }
        }
        panic!("no end");
    }
}

/// A test I/O: read or write `blocks` at `lba` through slot `cid`.
#[derive(Clone, Debug)]
struct Io {
    write: bool,
    lba: u64,
    blocks: u32,
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 17 + 3) as u8).collect()
}

/// Runs `ios` at once (CID = index), cutting the streams by `cuts`;
/// checks every completion and every byte read against a model.
fn exercise(p: &mut Pair, ios: &[Io], cuts: &[usize]) {
    let mut model = p.ctl.store.clone();
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    for (i, io) in ios.iter().enumerate() {
        let len = io.blocks as usize * BS;
        let at = io.lba as usize * BS;
        let (opc, buf) = if io.write {
            let b = pattern(i, len);
            model[at..at + len].copy_from_slice(&b);
            (NvmOpcode::Write, b)
        } else {
            (NvmOpcode::Read, vec![0u8; len])
        };
        bufs.push(buf);
        let sqe = Sqe::rw(opc, 1, io.lba, io.blocks);
        let a = bufs[i].as_ptr() as usize as u64;
        let data = if io.write {
            Data::Out {
                addr: a,
                len: len as u32,
            }
        } else {
            Data::In {
                addr: a,
                len: len as u32,
            }
        };
        // SAFETY: `bufs[i]` stays allocated and untouched until the
        // completions below are in (its heap memory does not move when
        // `bufs` grows).
        unsafe { p.host.submit(i as u16, sqe, data, i as u16, false) }.unwrap();
    }
    p.run(cuts);
    let mut tags: Vec<u16> = p.done.iter().map(|d| d.0).collect();
    tags.sort();
    assert_eq!(tags, (0..ios.len() as u16).collect::<Vec<_>>());
    assert!(p.done.iter().all(|d| d.1 == 0), "{:?}", p.done);
    // Reads saw what was there before this round (no read overlaps a
    // write in the same round, nor two writes: see `ios`).
    for (i, io) in ios.iter().enumerate() {
        let at = io.lba as usize * BS;
        if !io.write {
            assert!(
                bufs[i] == p.ctl.store[at..at + bufs[i].len()],
                "read {i} differs"
            );
        }
    }
    assert!(p.ctl.store == model, "the namespace differs from the model");
    assert!(p.ctl.sending.is_empty(), "read buffers never released");
    p.done.clear();
}

fn reads_and_writes() -> Vec<Io> {
    vec![
        // In-capsule (1 KiB < 8 KiB ICD) and R2T writes.
        Io {
            write: true,
            lba: 0,
            blocks: 2,
        },
        Io {
            write: true,
            lba: 8,
            blocks: 40,
        },
        Io {
            write: false,
            lba: 100,
            blocks: 1,
        },
        Io {
            write: false,
            lba: 120,
            blocks: 64,
        },
    ]
}

#[test]
fn reads_and_writes_round_trip_every_way() {
    for digests in [Digests::NONE, Digests::BOTH] {
        for flow in [false, true] {
            for chunk in [512, 4096, 1 << 20] {
                let mut p = Pair::new(digests, 4096, chunk, flow, 8192);
                exercise(&mut p, &reads_and_writes(), &[usize::MAX]);
                exercise(&mut p, &reads_and_writes(), &[1]);
                exercise(&mut p, &reads_and_writes(), &[7, 100, 3, 4096]);
            }
        }
    }
}

#[test]
fn an_r2t_is_answered_in_pieces_of_maxh2cdata_in_order() {
    let mut p = Pair::new(Digests::NONE, 4096, 4096, false, 0);
    let ios = [Io {
        write: true,
        lba: 0,
        blocks: 20, // 10 KiB: 4 + 4 + 2 KiB
    }];
    exercise(&mut p, &ios, &[usize::MAX]);
    let seen: Vec<(u32, u32)> = p.ctl.h2c_seen.iter().map(|h| (h.1, h.2)).collect();
    assert_eq!(seen, vec![(0, 4096), (4096, 4096), (8192, 2048)]);
}

#[test]
fn bounce_commands_get_their_data_back_with_the_completion() {
    let mut p = Pair::new(Digests::BOTH, 4096, 700, false, 0);
    let sqe = Sqe::rw(NvmOpcode::Read, 1, 3, 4);
    // SAFETY: no buffer address: the data goes to the slot's bounce.
    unsafe {
        p.host
            .submit(5, sqe, Data::InBounce { len: 2048 }, 77, true)
    }
    .unwrap();
    p.run(&[13]);
    assert_eq!(p.done.len(), 1);
    let (tag, st, data) = &p.done[0];
    assert_eq!((*tag, *st), (77, 0));
    assert_eq!(data[..], p.ctl.store[3 * BS..3 * BS + 2048]);
}

#[test]
fn icreq_is_answered_with_the_digests_asked_for_and_the_limits() {
    let mut ctl = Ctl::new(16384, 4096, false);
    let req = ic::host_icreq(Digests {
        header: true,
        data: false,
    });
    // In two pieces: nothing happens before the whole ICReq is in.
    assert_eq!(ctl.feed(&req.as_bytes()[..100]).unwrap(), 0);
    assert!(!ctl.initialized);
    assert_eq!(ctl.feed(req.as_bytes()).unwrap(), 128);
    let p = ctl.q.params().unwrap();
    assert!(p.digests.header && !p.digests.data);
    let resp = ctl.out();
    let hp = ic::host_icresp(&resp, p.digests).unwrap();
    assert_eq!(hp.maxh2cdata, 16384);
    // A host that asked for other digests refuses the answer.
    let e = ic::host_icresp(&resp, Digests::BOTH).unwrap_err();
    assert!(
        e.contains("asked for header digest on / data digest on"),
        "{e}"
    );
}

#[test]
fn a_controller_refusing_the_connection_is_named() {
    let t = TermReq::new(Role::Controller, Fes::UNSUPPORTED_PARAMETER, 8, 0);
    let e = ic::host_icresp(t.as_bytes(), Digests::NONE).unwrap_err();
    assert!(e.contains("refused the connection"), "{e}");
    assert!(ic::host_first_pdu_len(&t.as_bytes()[..8]).is_ok());
}

/// A host queue with one read outstanding (CID 0, 1 KiB into `buf`).
fn host_with_read(digests: Digests, buf: &mut [u8]) -> HostQueue<Pointers> {
    let params = HostParams {
        digests,
        cpda: 0,
        maxh2cdata: 4096,
    };
    let mut h = HostQueue::new(Pointers, addr(), 1, params, 4);
    let sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 2);
    let a = buf.as_mut_ptr() as usize as u64;
    // SAFETY: `buf` outlives the queue in every test and is not touched
    // while the read is outstanding.
    unsafe { h.submit(0, sqe, Data::In { addr: a, len: 1024 }, 0, false) }.unwrap();
    h.tx.clear();
    h
}

fn c2h(cid: u16, datao: u32, data: &[u8], digests: Digests) -> Vec<u8> {
    let (h, l) = C2HData::new(cid, datao, data.len() as u32, true, true, digests, 0).unwrap();
    let mut q = SendQueue::default();
    q.push_header(h.as_bytes(), &l);
    q.push_bytes(data);
    if l.ddgst {
        q.push_bytes(&pollux_spec::tcp::data_digest([data]).to_le_bytes());
    }
    drain(&mut q, &mut Vec::new())
}

#[test]
fn c2h_data_beyond_the_buffer_is_refused_before_a_byte_is_copied() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let pdu = c2h(0, 0, &[0xEE; 1536], Digests::NONE);
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, _| panic!("completed"));
    assert!(r.failed);
    let e = h.take_error().expect("refused");
    assert_eq!(e.kind, HostErrorKind::BadPdu);
    let term = e.term.expect("a Termination Request to send");
    let t = TermReq::read_from_prefix(&term).unwrap().0;
    assert_eq!(t.fes(), Fes::DATA_TRANSFER_OUT_OF_RANGE);
    // It carries the offending header.
    assert_eq!(&term[24..48], &pdu[..24]);
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn a_bad_data_digest_fails_the_command_not_the_connection() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::BOTH, &mut buf);
    let mut pdu = c2h(0, 0, &[0x11; 1024], Digests::BOTH);
    let n = pdu.len();
    pdu[n - 1] ^= 0xFF;
    let mut got = Vec::new();
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, c| got.push(c.status >> 1));
    assert!(!r.failed);
    assert_eq!(r.consumed, pdu.len());
    assert_eq!(
        got,
        vec![Status::generic(generic::TRANSIENT_TRANSPORT_ERROR).0]
    );
}

#[test]
fn a_bad_header_digest_is_fatal_with_fes_3() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::BOTH, &mut buf);
    let mut pdu = c2h(0, 0, &[0x11; 1024], Digests::BOTH);
    pdu[24] ^= 1;
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, _| panic!("completed"));
    assert!(r.failed);
    let e = h.take_error().unwrap();
    let t = TermReq::read_from_prefix(&e.term.unwrap()).unwrap().0;
    assert_eq!(t.fes(), Fes::HEADER_DIGEST_ERROR);
}

#[test]
fn answers_for_commands_not_outstanding_end_the_connection() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let resp = CapsuleResp::new(
        Cqe {
            cid: 3,
            ..Cqe::default()
        },
        false,
    );
    let r = h.receive(resp.as_bytes(), u32::MAX, &mut |_, _, _| panic!());
    assert!(r.failed);
    assert_eq!(h.take_error().unwrap().kind, HostErrorKind::Protocol);
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let r2t = R2T::new(0, 0, 0, 512, false);
    let r = h.receive(r2t.as_bytes(), u32::MAX, &mut |_, _, _| panic!());
    assert!(r.failed);
    let e = h.take_error().unwrap();
    assert_eq!(e.kind, HostErrorKind::Protocol);
    assert!(e.what.contains("no data to send"), "{}", e.what);
}

#[test]
fn a_termination_request_ends_the_connection_after_its_data() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let t = TermReq::new(Role::Controller, Fes::PDU_SEQUENCE_ERROR, 0, 24);
    let mut pdu = t.as_bytes().to_vec();
    pdu.extend_from_slice(&[0xAB; 24]);
    // The header alone: nothing yet.
    let r = h.receive(&pdu[..30], u32::MAX, &mut |_, _, _| panic!());
    assert!(!r.failed);
    let r2 = h.receive(&pdu[r.consumed..], u32::MAX, &mut |_, _, _| panic!());
    assert!(r2.failed);
    let e = h.take_error().unwrap();
    assert_eq!(e.kind, HostErrorKind::TermReq);
}

#[test]
fn a_completion_arriving_before_the_write_data_left_leaves_a_copy() {
    let params = HostParams {
        digests: Digests::NONE,
        cpda: 0,
        maxh2cdata: 4096,
    };
    let mut h = HostQueue::new(Pointers, addr(), 1, params, 4);
    h.icd_max = 8192;
    let mut buf = vec![0x5Au8; 1024];
    let a = buf.as_ptr() as usize as u64;
    let sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 2);
    // SAFETY: `buf` is written only after the completion below.
    unsafe { h.submit(2, sqe, Data::Out { addr: a, len: 1024 }, 2, false) }.unwrap();
    let resp = CapsuleResp::new(
        Cqe {
            cid: 2,
            ..Cqe::default()
        },
        false,
    );
    let mut n = 0;
    h.receive(resp.as_bytes(), u32::MAX, &mut |_, _, _| n += 1);
    assert_eq!(n, 1);
    buf.fill(0);
    let wire = drain(&mut h.tx, &mut Vec::new());
    assert_eq!(wire.len(), 72 + 1024);
    assert!(wire[72..].iter().all(|&b| b == 0x5A));
}

/// The controller's checks of H2CData.
fn ctl_awaiting_write() -> (Ctl, Digests) {
    let d = Digests::NONE;
    let mut ctl = Ctl::new(4096, 4096, false);
    ctl.feed(ic::host_icreq(d).as_bytes()).unwrap();
    ctl.out();
    ctl.q.r2t(3, 9, 2048);
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 4);
    sqe.cid = 9;
    ctl.writes.insert(3, (sqe, vec![0; 2048]));
    let r2t = ctl.out();
    let r = R2T::read_from_prefix(&r2t).unwrap().0;
    assert_eq!((r.cccid, r.ttag, r.r2to, r.r2tl), (9, 3, 0, 2048));
    (ctl, d)
}

fn h2c(cccid: u16, ttag: u16, datao: u32, len: u32, d: Digests) -> Vec<u8> {
    let (h, l) = pollux_spec::tcp::H2CData::new(cccid, ttag, datao, len, true, d, 0).unwrap();
    let mut v = h.as_bytes().to_vec();
    v.resize(l.plen as usize, 0x42);
    v
}

#[test]
fn h2c_data_for_no_transfer_or_another_command_is_fatal() {
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 4, 0, 512, d)).unwrap_err();
    let TargetError::Fatal {
        fes, fei, header, ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        (fes, fei),
        (Fes::INVALID_HEADER_FIELD, Field::Ttag.offset())
    );
    assert_eq!(header.len(), 24);
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(8, 3, 0, 512, d)).unwrap_err();
    assert!(matches!(e, TargetError::Fatal { fei, .. } if fei == Field::Cccid.offset()));
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 3, 512, 512, d)).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Fatal {
            fes: Fes::DATA_TRANSFER_OUT_OF_RANGE,
            ..
        }
    ));
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 3, 0, 4096, d)).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Fatal {
            fes: Fes::DATA_TRANSFER_OUT_OF_RANGE,
            ..
        }
    ));
}

#[test]
fn h2c_data_completes_its_transfer_once_all_of_it_is_in() {
    let (mut ctl, d) = ctl_awaiting_write();
    ctl.feed(&h2c(9, 3, 0, 1024, d)).unwrap();
    assert!(ctl.q.awaiting(3));
    ctl.feed(&h2c(9, 3, 1024, 1024, d)).unwrap();
    assert!(!ctl.q.awaiting(3));
    // A response went out for CID 9.
    let out = ctl.out();
    let r = CapsuleResp::read_from_prefix(&out).unwrap().0;
    assert_eq!(r.cqe.cid, 9);
    // More data for it now is fatal.
    assert!(ctl.feed(&h2c(9, 3, 2048, 512, d)).is_err());
}

#[test]
fn a_cancelled_transfer_takes_no_more_data() {
    let (mut ctl, d) = ctl_awaiting_write();
    ctl.q.cancel(3);
    assert!(ctl.feed(&h2c(9, 3, 0, 512, d)).is_err());
}

#[test]
fn pdus_before_icreq_are_sequence_errors_and_a_bad_term_req_length_closes() {
    let mut ctl = Ctl::new(4096, 4096, false);
    let (cmd, _) = pollux_spec::tcp::CapsuleCmd::new(&Sqe::new(0, 0), 0, Digests::NONE, 0).unwrap();
    let e = ctl.feed(cmd.as_bytes()).unwrap_err();
    assert!(
        matches!(
            e,
            TargetError::Fatal {
                fes: Fes::PDU_SEQUENCE_ERROR,
                ..
            }
        ),
        "{e:?}"
    );
    let mut ctl = Ctl::new(4096, 4096, false);
    let mut t = TermReq::new(Role::Host, Fes::PDU_SEQUENCE_ERROR, 0, 0);
    t.ch.plen = 4000;
    let e = ctl.feed(t.as_bytes()).unwrap_err();
    assert_eq!(e, TargetError::TermReqLength { plen: 4000 });
}

#[test]
fn the_host_terminating_is_an_event() {
    let mut ctl = Ctl::new(4096, 4096, false);
    ctl.feed(ic::host_icreq(Digests::NONE).as_bytes()).unwrap();
    let t = TermReq::new(Role::Host, Fes::HEADER_DIGEST_ERROR, 0x1234, 0);
    ctl.feed(t.as_bytes()).unwrap();
    assert_eq!(ctl.terminated, Some((Fes::HEADER_DIGEST_ERROR, 0x1234)));
}

#[test]
fn a_termination_request_carries_the_offending_header() {
    let mut q = TargetQueue::new(
        TargetLimits {
            maxh2cdata: 4096,
            icd: 0,
        },
        1,
    );
    q.terminate(Fes::INVALID_HEADER_FIELD, 4, &[0xCD; 200]);
    let out = drain(&mut q.tx, &mut Vec::new());
    assert_eq!(out.len(), 24 + 128);
    let t = TermReq::read_from_prefix(&out).unwrap().0;
    assert_eq!(
        (t.fes(), t.fei(), t.data_len()),
        (Fes::INVALID_HEADER_FIELD, 4, 128)
    );
}

#[test]
fn send_data_marks_come_after_the_data_and_the_response() {
    let mut q = TargetQueue::new(
        TargetLimits {
            maxh2cdata: 4096,
            icd: 0,
        },
        2,
    );
    let data = vec![7u8; 3000];
    let resp = Cqe {
        cid: 4,
        ..Cqe::default()
    };
    // SAFETY: `data` outlives the drain below.
    assert!(unsafe { q.send_data(4, &data, 1024, Some(resp), 1) });
    let mut marks = Vec::new();
    let out = drain(&mut q.tx, &mut marks);
    assert_eq!(marks, vec![1]);
    // Three C2HData PDUs (none with SUCCESS), then the response.
    let l = PduLayout::new(PduType::C2HData, Digests::NONE, 0, 1024).unwrap();
    assert_eq!(out.len(), 2 * l.plen as usize + 24 + 952 + 24);
    let first = C2HData::read_from_prefix(&out).unwrap().0;
    assert_eq!(first.ch.flags & (flags::LAST_PDU | flags::SUCCESS), 0);
}

#[test]
fn the_send_queue_resumes_mid_segment_and_reports_marks_in_order() {
    let mut q = SendQueue::default();
    let ext = [9u8; 10];
    q.push_bytes(b"abc");
    q.push_bytes(b"def");
    q.push_ext(ext.as_ptr() as usize as u64, ext.len(), 1);
    q.push_mark(1);
    q.push_bytes(b"xyz");
    q.push_mark(2);
    assert_eq!(q.segments().count(), 5, "abc and def merge");
    let mut marks = Vec::new();
    q.advance(4, |m| marks.push(m));
    let mut iov = [IoSlice::new(&[]); 4];
    // SAFETY: `ext` lives through the test.
    let n = unsafe { q.iovecs(&Pointers, &mut iov) };
    assert_eq!(n, 3);
    assert_eq!(&*iov[0], b"ef");
    assert_eq!(iov[1].len(), 10);
    q.advance(2 + 10, |m| marks.push(m));
    assert_eq!(marks, vec![1]);
    q.advance(3, |m| marks.push(m));
    assert_eq!(marks, vec![1, 2]);
    assert!(q.is_empty());
    assert_eq!(q.own_len(), 0);
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..300, 1..20)
}

fn ios() -> impl Strategy<Value = Vec<Io>> {
    // Reads of the upper half, anywhere; writes of the lower, one after
    // the other: no two I/Os of a round overlap unless both read.
    prop::collection::vec((any::<bool>(), 0u64..100, 1u32..11), 1..12).prop_map(|v| {
        let mut next = 0;
        v.into_iter()
            .map(|(write, lba, blocks)| {
                let lba = if write {
                    next += blocks as u64;
                    next - blocks as u64
                } else {
                    128 + lba
                };
                Io { write, lba, blocks }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// However both byte streams are cut, every command completes once
    /// with its data, under any digests, PDU sizes and flow control.
    #[test]
    fn any_split_of_both_streams_gives_the_same_result(
        ios in ios(),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
        flow in any::<bool>(),
        chunk in prop::sample::select(vec![512u32, 1000, 4096, 1 << 20]),
        maxh2c in prop::sample::select(vec![4096u32, 8192]),
        icd in prop::sample::select(vec![0u32, 4096, 8192]),
    ) {
        let mut p = Pair::new(Digests { header: hd, data: dd }, maxh2c, chunk, flow, icd);
        exercise(&mut p, &ios, &cuts);
    }

    /// The host end reassembles a controller's stream cut anywhere into
    /// the same completions and data as the whole stream.
    #[test]
    fn host_reassembly_does_not_depend_on_the_cuts(
        sizes in prop::collection::vec(1u32..3000, 1..8),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
    ) {
        let digests = Digests { header: hd, data: dd };
        let params = HostParams { digests, cpda: 0, maxh2cdata: 4096 };
        let total: u32 = sizes.iter().sum();
        let mut stream = Vec::new();
        let mut off = 0;
        for (i, &s) in sizes.iter().enumerate() {
            let last = i + 1 == sizes.len();
            let data = pattern(i, s as usize);
            let (h, l) = C2HData::new(0, off, s, last, last, digests, 0).unwrap();
            let mut q = SendQueue::default();
            q.push_header(h.as_bytes(), &l);
            q.push_bytes(&data);
            if l.ddgst {
                q.push_bytes(&pollux_spec::tcp::data_digest([&data[..]]).to_le_bytes());
            }
            stream.extend(drain(&mut q, &mut Vec::new()));
            off += s;
        }
        let mut results = Vec::new();
        for split in [vec![usize::MAX], cuts.clone()] {
            let mut buf = vec![0u8; total as usize];
            let mut h = HostQueue::new(Pointers, addr(), 1, params, 1);
            let sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
            let a = buf.as_mut_ptr() as usize as u64;
            // SAFETY: `buf` is read only after the completion.
            unsafe { h.submit(0, sqe, Data::In { addr: a, len: total }, 0, false) }.unwrap();
            let mut done = Vec::new();
            let mut pending: Vec<u8> = Vec::new();
            let mut at = 0;
            let mut k = 0;
            while at < stream.len() {
                let n = split[k % split.len()].min(stream.len() - at);
                k += 1;
                pending.extend_from_slice(&stream[at..at + n]);
                at += n;
                let r = h.receive(&pending, u32::MAX, &mut |w, _, c| done.push((w, c.status)));
                prop_assert!(!r.failed);
                pending.drain(..r.consumed);
            }
            prop_assert!(pending.is_empty());
            results.push((done, buf));
        }
        prop_assert_eq!(&results[0], &results[1]);
        prop_assert_eq!(&results[0].0, &vec![(0u16, 0u16)]);
        let want: Vec<u8> = sizes.iter().enumerate().flat_map(|(i, &s)| pattern(i, s as usize)).collect();
        prop_assert_eq!(&results[0].1, &want);
    }

    /// The controller end reassembles a host's stream of capsules cut
    /// anywhere into the same commands and in-capsule data.
    #[test]
    fn target_reassembly_does_not_depend_on_the_cuts(
        sizes in prop::collection::vec(0u32..3000, 1..10),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
    ) {
        let digests = Digests { header: hd, data: dd };
        let params = HostParams { digests, cpda: 0, maxh2cdata: 4096 };
        let mut h = HostQueue::new(Pointers, addr(), 1, params, 16);
        let datas: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| pattern(i, s as usize)).collect();
        for (i, d) in datas.iter().enumerate() {
            let sqe = Sqe::rw(NvmOpcode::Write, 1, i as u64, 1);
            // SAFETY: no buffer address: the bytes are copied at once.
            unsafe { h.submit(i as u16, sqe, Data::Bytes(d), i as u16, false) }.unwrap();
        }
        let mut stream = ic::host_icreq(digests).as_bytes().to_vec();
        stream.extend(drain(&mut h.tx, &mut Vec::new()));
        let mut results = Vec::new();
        for split in [vec![usize::MAX], cuts.clone()] {
            let mut q = TargetQueue::new(TargetLimits { maxh2cdata: 4096, icd: 8192 }, 4);
            let mut got: Vec<(u16, Vec<u8>, bool)> = Vec::new();
            let mut pending: Vec<u8> = Vec::new();
            let mut at = 0;
            let mut k = 0;
            while at < stream.len() {
                let n = split[k % split.len()].min(stream.len() - at);
                k += 1;
                pending.extend_from_slice(&stream[at..at + n]);
                at += n;
                let mut used = 0;
                loop {
                    let (u, ev) = q.next(&pending[used..]).expect("valid stream");
                    used += u;
                    let Some(ev) = ev else { break };
                    match ev {
                        TargetEvent::Capsule { sqe, data, end, .. } => {
                            let ok = matches!(end, Some(Ended::Capsule { digest_ok: true }));
                            got.push((sqe.cid, data.unwrap_or_default().to_vec(), ok));
                        }
                        TargetEvent::Data { offset, bytes, end } => {
                            let g = got.last_mut().unwrap();
                            prop_assert_eq!(offset as usize, g.1.len());
                            g.1.extend_from_slice(bytes);
                            if let Some(Ended::Capsule { digest_ok }) = end {
                                g.2 = digest_ok;
                            }
                        }
                        TargetEvent::End(Ended::Capsule { digest_ok }) => {
                            got.last_mut().unwrap().2 = digest_ok;
                        }
                        _ => {}
                    }
                }
                pending.drain(..used);
            }
            prop_assert!(pending.is_empty());
            results.push(got);
        }
        prop_assert_eq!(&results[0], &results[1]);
        let want: Vec<(u16, Vec<u8>, bool)> =
            datas.iter().enumerate().map(|(i, d)| (i as u16, d.clone(), true)).collect();
        prop_assert_eq!(&results[0], &want);
    }
}
