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
use crate::engine::target::{sqe_of, Ended, TargetError, TargetEvent, TargetQueue};
use crate::engine::tx::{Seg, SendQueue};

mod host;
mod props;
mod target;

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
                self.capsule = Some((sqe_of(sqe), Vec::with_capacity(data_len as usize)));
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
            // A fabrics command (Authentication Receive) returns a short
            // message, 100 bytes, whatever the length asked for (as SPDK's
            // target sends only the AUTH message).
            0x7F => {
                let ttag = self.ttag();
                let buf = vec![0xAB; 100];
                let resp = Some(Self::ok(sqe.cid));
                // SAFETY: as for a read: kept in `sending` until its mark.
                let ok = unsafe { self.q.send_data(sqe.cid, &buf, self.c2h_chunk, resp, ttag) };
                assert!(ok);
                self.sending.insert(ttag, buf);
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

/// An Authentication Receive on an I/O queue whose controller sends only
/// the AUTH message, shorter than the allocation length (SPDK's target):
/// success, the rest zeros, as on the admin queue. Before, the host failed
/// it with Data Transfer Error, so authenticating an I/O queue failed.
#[test]
fn a_short_fabrics_transfer_on_an_io_queue_succeeds_zero_filled() {
    use pollux_spec::fabrics::{AuthCmd, SglDescriptor};
    let mut p = Pair::new(Digests::NONE, 4096, 4096, false, 0);
    let sqe = AuthCmd::receive(4096, SglDescriptor::tcp_transport(4096)).to_sqe();
    // SAFETY: no buffer address: the data goes to the slot's bounce.
    unsafe {
        p.host
            .submit(5, sqe, Data::InBounce { len: 4096 }, 77, true)
    }
    .unwrap();
    p.run(&[usize::MAX]);
    let (tag, st, data) = &p.done[0];
    assert_eq!((*tag, *st), (77, 0), "status {st:#x}");
    assert!(data[..100].iter().all(|&b| b == 0xAB));
    assert!(data[100..].iter().all(|&b| b == 0));
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
