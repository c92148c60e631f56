//! A small scripted NVMe/TCP controller on loopback, speaking PDUs through
//! `pollux_spec`'s builders and checker: enough of fabrics (Connect,
//! Property Get/Set), admin (Identify, Set Features, Keep Alive) and NVM
//! (Read, Write on a RAM namespace) to drive the host transport, with
//! switches that make it misbehave.
#![allow(dead_code)]
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use pollux_spec::fabrics::{
    set_property_value, ConnectCmd, ConnectData, FabricsCmd, FcType, PropertyGetCmd,
    PropertySetCmd, PropertySize, Sgl,
};
use pollux_spec::identify::{IdentifyController, IdentifyNamespace};
use pollux_spec::tcp::{
    data_digest, digest_bytes, write_header, C2HData, CapsuleResp, CommonHeader, Digests, Fes,
    IcResp, PduHeader, PduLayout, PduType, Role, RxConfig, TermReq, R2T,
};
use pollux_spec::{Cqe, Sqe};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

pub const SUBNQN: &str = "nqn.2026-01.io.pollux:fake";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const NSZE: u64 = 2048; // 512-byte blocks: 1 MiB

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct Script {
    /// In-capsule data bytes for I/O writes (IOCCSZ = 4 + this / 16).
    pub icd: u32,
    pub maxh2cdata: u32,
    /// Bytes per R2T.
    pub r2t_chunk: u32,
    /// Bytes per C2HData PDU.
    pub c2h_chunk: u32,
    /// Complete reads with the SUCCESS flag instead of a CapsuleResp.
    pub c2h_success: bool,
    /// Refuse an I/O Connect asking to disable SQ flow control (Connect
    /// Invalid Parameters at CATTR), as a controller without it would.
    pub refuse_sqflow_disable: bool,
    /// The n-th I/O read (1-based, counted over the fake's life) gets a
    /// C2HData whose DATAL exceeds the command's buffer by 512 bytes.
    pub overflow_read: Option<u32>,
    /// The n-th I/O read gets a C2HData with a wrong data digest.
    pub bad_ddgst_read: Option<u32>,
    /// On the n-th I/O read, close the connection without answering.
    pub drop_on_read: Option<u32>,
    /// On the n-th I/O read, send a C2HTermReq.
    pub term_on_read: Option<u32>,
    /// Every read of this LBA closes the connection without an answer.
    pub drop_on_lba: Option<u64>,
    /// Hold back answers to reads until this many are outstanding.
    pub batch_reads: u32,
    /// Answer a Get Log Page (of an NVM controller) late: its data (0xC3
    /// bytes) and completion go out just before the answer to the first
    /// command received after `Fake::release_log` is set.
    pub hold_log_page: bool,
    /// On an I/O queue, once the first command capsule is in: answer
    /// command CID N (success) at once, before reading anything more, then
    /// read nothing until `Fake::release_reads` is set; afterwards serve as
    /// usual, without a second answer for N, keeping N's in-capsule data
    /// in `Seen::early_data`. The listener's receive buffer is kept small,
    /// so what the host sends backs up in its own send queue.
    pub answer_early: Option<u16>,
    /// Metadata bytes per block of the namespace's LBA format.
    pub ms: u16,
    /// On I/O queues, every PDU goes out in writes of this many bytes
    /// (TCP_NODELAY, a pause between), so the host receives headers cut
    /// anywhere.
    pub trickle: Option<usize>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            icd: 8192,
            maxh2cdata: 16384,
            r2t_chunk: 32768,
            c2h_chunk: 16384,
            c2h_success: false,
            refuse_sqflow_disable: false,
            overflow_read: None,
            bad_ddgst_read: None,
            drop_on_read: None,
            term_on_read: None,
            drop_on_lba: None,
            batch_reads: 1,
            hold_log_page: false,
            answer_early: None,
            ms: 0,
            trickle: None,
        }
    }
}

/// What the fake saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub connects: Vec<(u16, u16, String, String, u32)>, // qid, cntlid asked, subnqn, hostnqn, kato
    /// CATTR of each Connect, in order.
    pub cattrs: Vec<u8>,
    pub cntlids: Vec<u16>,
    pub in_capsule_writes: u32,
    pub r2ts: u32,
    pub h2c_pdus: u32,
    pub keep_alives: u32,
    pub term_reqs: Vec<(u16, u32)>,
    pub digests: Vec<Digests>,
    pub errors: Vec<String>,
    /// Get Log Page answers sent late (`Script::hold_log_page`).
    pub late_logs: u32,
    /// In-capsule data of the command answered early (`Script::answer_early`).
    pub early_data: Vec<u8>,
    /// Reads of `Script::drop_on_lba`.
    pub poison_reads: u32,
}

pub struct Fake {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
    pub store: Arc<Mutex<Vec<u8>>>,
    /// Stop accepting connections (new ones are refused).
    pub refuse: Arc<AtomicBool>,
    /// Lets a held Get Log Page answer go (`Script::hold_log_page`).
    pub release_log: Arc<AtomicBool>,
    /// Lets the fake read again after an early answer (`Script::answer_early`).
    pub release_reads: Arc<AtomicBool>,
}

struct Ctrl {
    cc: u32,
    csts: u32,
}

struct Shared {
    script: Script,
    release_log: Arc<AtomicBool>,
    release_reads: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    store: Arc<Mutex<Vec<u8>>>,
    reads: AtomicU32,
    next_cntlid: AtomicU32,
    ctrls: Mutex<Vec<(u16, Ctrl)>>,
}

impl Fake {
    pub fn start(script: Script) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        if script.answer_early.is_some() {
            small_receive_buffer(&l);
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let store = Arc::new(Mutex::new(vec![0u8; (NSZE * 512) as usize]));
        let refuse = Arc::new(AtomicBool::new(false));
        let release_log = Arc::new(AtomicBool::new(false));
        let release_reads = Arc::new(AtomicBool::new(false));
        let sh = Arc::new(Shared {
            script,
            release_log: release_log.clone(),
            release_reads: release_reads.clone(),
            seen: seen.clone(),
            store: store.clone(),
            reads: AtomicU32::new(0),
            next_cntlid: AtomicU32::new(1),
            ctrls: Mutex::new(Vec::new()),
        });
        let r = refuse.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                if r.load(Ordering::Acquire) {
                    drop(s);
                    continue;
                }
                let sh = sh.clone();
                std::thread::spawn(move || {
                    let mut c = FakeConn::new(s, sh);
                    if let Err(e) = c.run() {
                        c.sh.seen.lock().unwrap().errors.push(e);
                    }
                });
            }
        });
        Fake {
            addr,
            seen,
            store,
            refuse,
            release_log,
            release_reads,
        }
    }

    /// Stops listening for good (connections are refused by the kernel is
    /// not possible with the listener thread blocked; new ones are closed
    /// at once instead).
    pub fn refuse_connections(&self) {
        self.refuse.store(true, Ordering::Release);
    }

    /// Accepts connections again (after `refuse_connections`).
    pub fn accept_connections(&self) {
        self.refuse.store(false, Ordering::Release);
    }
}

struct FakeConn {
    s: TcpStream,
    sh: Arc<Shared>,
    cfg: RxConfig,
    digests: Digests,
    qid: u16,
    cntlid: u16,
    /// Reads held back (batch_reads): (cid, slba, len).
    held: Vec<(u16, u64, u32)>,
    /// Close the connection after this command, without answering.
    drop_now: bool,
    /// Connected to the discovery subsystem.
    discovery: bool,
    /// Capsules that arrived while a write waited for its data.
    pending: std::collections::VecDeque<(Sqe, Vec<u8>)>,
    /// A Get Log Page not answered yet: CID, bytes.
    held_log: Option<(u16, usize)>,
    /// `Script::answer_early` has been done on this connection.
    answered_early: bool,
}

/// A receive buffer of 64 KiB for the listener's connections (fixed:
/// no autotuning), so a host sending more backs up on its side.
fn small_receive_buffer(l: &TcpListener) {
    use std::os::fd::AsRawFd;
    let v: libc::c_int = 64 << 10;
    // SAFETY: setsockopt on a socket we own, with a pointer to a c_int and
    // its size.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
}

fn read_pdu(s: &mut TcpStream, cfg: &RxConfig) -> Result<(PduHeader, PduLayout, Vec<u8>), String> {
    let mut ch = [0u8; 8];
    s.read_exact(&mut ch).map_err(|e| format!("eof: {e}"))?;
    let h = CommonHeader::read(&ch).unwrap();
    let layout = h.check(cfg).map_err(|e| format!("check: {e}"))?;
    let mut pdu = vec![0u8; layout.plen as usize];
    pdu[..8].copy_from_slice(&ch);
    s.read_exact(&mut pdu[8..])
        .map_err(|e| format!("short: {e}"))?;
    let hdr = PduHeader::parse(&pdu, &layout, cfg).map_err(|e| format!("parse: {e}"))?;
    let data = pdu[layout.data_range()].to_vec();
    if let Some(r) = layout.data_digest_range() {
        let want = data_digest([&data[..]]);
        if digest_bytes(want) != pdu[r] {
            return Err("data digest mismatch from host".into());
        }
    }
    Ok((hdr, layout, data))
}

impl FakeConn {
    fn new(s: TcpStream, sh: Arc<Shared>) -> Self {
        FakeConn {
            s,
            sh,
            cfg: RxConfig::initial(Role::Controller),
            digests: Digests::NONE,
            qid: 0,
            cntlid: 0,
            held: Vec::new(),
            drop_now: false,
            discovery: false,
            pending: std::collections::VecDeque::new(),
            held_log: None,
            answered_early: false,
        }
    }

    fn send(&mut self, header: &[u8], layout: &PduLayout, data: &[u8], corrupt: bool) {
        let mut out = vec![0u8; layout.plen as usize];
        let n = write_header(header, layout, &mut out).unwrap();
        out[n..n + data.len()].copy_from_slice(data);
        if let Some(r) = layout.data_digest_range() {
            let mut d = data_digest([data]);
            if corrupt {
                d ^= 1;
            }
            out[r].copy_from_slice(&digest_bytes(d));
        }
        if let (Some(k), true) = (self.sh.script.trickle, self.qid > 0) {
            let _ = self.s.set_nodelay(true);
            for c in out.chunks(k.max(1)) {
                let _ = self.s.write_all(c);
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            return;
        }
        let _ = self.s.write_all(&out);
    }

    fn resp(&mut self, cid: u16, status: u16, dw0: u32, dw1: u32) {
        let cqe = Cqe {
            dw0,
            dw1,
            sqhd: 0,
            sqid: self.qid,
            cid,
            status: status << 1,
        };
        let r = CapsuleResp::new(cqe, self.digests.header);
        let layout = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0).unwrap();
        self.send(&r.as_bytes()[..24], &layout, &[], false);
    }

    fn c2h(&mut self, cid: u16, data: &[u8], success: bool, corrupt: bool, extra: u32) {
        let chunk = self.sh.script.c2h_chunk as usize;
        let mut off = 0;
        while off < data.len() {
            let l = chunk.min(data.len() - off);
            let last = off + l == data.len();
            let datal = l as u32 + if last { extra } else { 0 };
            let (h, layout) = C2HData::new(
                cid,
                off as u32,
                datal,
                last,
                success && last,
                self.digests,
                0,
            )
            .unwrap();
            let mut d = data[off..off + l].to_vec();
            d.resize(datal as usize, 0xEE);
            self.send(h.as_bytes(), &layout, &d, corrupt && last);
            off += l;
        }
    }

    fn run(&mut self) -> Result<(), String> {
        // ICReq
        let (h, _, _) = read_pdu(&mut self.s, &self.cfg)?;
        let PduHeader::IcReq(req) = h else {
            return Err("expected ICReq".into());
        };
        self.digests = req.digests();
        self.sh.seen.lock().unwrap().digests.push(self.digests);
        let resp = IcResp::new(0, self.digests, self.sh.script.maxh2cdata);
        self.s
            .write_all(resp.as_bytes())
            .map_err(|e| e.to_string())?;
        self.cfg = RxConfig {
            receiver: Role::Controller,
            established: true,
            digests: self.digests,
            pda: 0,
            max_plen: 1 << 24,
            maxh2cdata: self.sh.script.maxh2cdata,
        };
        loop {
            while let Some((sqe, icd)) = self.pending.pop_front() {
                self.command(sqe, icd)?;
            }
            let (h, _layout, data) = match read_pdu(&mut self.s, &self.cfg) {
                Ok(x) => x,
                Err(e) if e.starts_with("eof") => return Ok(()),
                Err(e) => return Err(e),
            };
            match h {
                PduHeader::CapsuleCmd(c) if self.qid > 0 && !self.answered_early => {
                    if let Some(early) = self.sh.script.answer_early {
                        self.answered_early = true;
                        self.resp(early, 0, 0, 0);
                        while !self.sh.release_reads.load(Ordering::Acquire) {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                    self.command(c.sqe(), data)?
                }
                PduHeader::CapsuleCmd(c) => self.command(c.sqe(), data)?,
                PduHeader::TermReq(t) => {
                    self.sh
                        .seen
                        .lock()
                        .unwrap()
                        .term_reqs
                        .push((t.fes().0, t.fei()));
                    return Ok(());
                }
                other => return Err(format!("unexpected {other:?}")),
            }
            if self.drop_now {
                // Close after what was sent (FIN, not RST: a close with
                // unread data resets, and the host's kernel then discards
                // answers already on their way): read until the host closes.
                let _ = self.s.shutdown(std::net::Shutdown::Write);
                let mut sink = [0u8; 4096];
                while matches!(self.s.read(&mut sink), Ok(k) if k > 0) {}
                return Ok(());
            }
        }
    }
}

impl FakeConn {
    fn command(&mut self, sqe: Sqe, icd: Vec<u8>) -> Result<(), String> {
        if self.held_log.is_some() && self.sh.release_log.load(Ordering::Acquire) {
            if let Some((cid, len)) = self.held_log.take() {
                self.c2h(cid, &vec![0xC3; len], false, false, 0);
                self.resp(cid, 0, 0, 0);
                self.sh.seen.lock().unwrap().late_logs += 1;
            }
        }
        let cid = sqe.cid;
        if sqe.opc == 0x7F {
            let f = FabricsCmd::from_sqe(&sqe);
            match FcType::from_u8(f.fctype) {
                Some(FcType::Connect) => {
                    let c = ConnectCmd::from_sqe(&sqe);
                    let d =
                        ConnectData::read_from_bytes(&icd[..1024]).map_err(|_| "connect data")?;
                    let sub = d.subnqn().unwrap_or("?").to_string();
                    let host = d.hostnqn().unwrap_or("?").to_string();
                    self.qid = c.qid;
                    self.sh.seen.lock().unwrap().connects.push((
                        c.qid,
                        d.cntlid,
                        sub.clone(),
                        host,
                        c.kato,
                    ));
                    self.sh.seen.lock().unwrap().cattrs.push(c.cattr);
                    self.discovery = sub == pollux_spec::fabrics::DISCOVERY_NQN;
                    if c.qid > 0
                        && self.sh.script.refuse_sqflow_disable
                        && c.cattr & pollux_spec::fabrics::CATTR_DISABLE_SQ_FLOW != 0
                    {
                        // Connect Invalid Parameters, IATTR 0 (command), IPO 46.
                        self.resp(cid, 0x182, 46, 0);
                        return Ok(());
                    }
                    if sub != SUBNQN && !self.discovery {
                        self.resp(cid, 0x184, 0, 0);
                        return Ok(());
                    }
                    if c.qid == 0 {
                        let id = self.sh.next_cntlid.fetch_add(1, Ordering::AcqRel) as u16;
                        self.cntlid = id;
                        self.sh
                            .ctrls
                            .lock()
                            .unwrap()
                            .push((id, Ctrl { cc: 0, csts: 0 }));
                        self.sh.seen.lock().unwrap().cntlids.push(id);
                    } else {
                        self.cntlid = d.cntlid;
                    }
                    self.resp(cid, 0, self.cntlid as u32, 0);
                }
                Some(FcType::PropertyGet) => {
                    let p = PropertyGetCmd::from_sqe(&sqe);
                    let v: u64 = match p.ofst {
                        // CAP: MQES 127, CQR, TO 1 (500 ms), CSS NVM.
                        0x00 => 127 | 1 << 16 | 1 << 24 | 1 << 37,
                        0x08 => 0x0002_0000,
                        0x14 => self.ctrl(|c| c.cc) as u64,
                        0x1C => self.ctrl(|c| c.csts) as u64,
                        _ => 0,
                    };
                    let mut cqe = Cqe::new_zeroed();
                    set_property_value(&mut cqe, v);
                    let _ = p.size();
                    self.resp(cid, 0, cqe.dw0, cqe.dw1);
                }
                Some(FcType::PropertySet) => {
                    let p = PropertySetCmd::from_sqe(&sqe);
                    if p.ofst == 0x14 {
                        let v = p.value as u32;
                        self.ctrl_mut(|c| {
                            c.cc = v;
                            let mut s = 0;
                            if v & 1 != 0 {
                                s |= 1;
                            }
                            if (v >> 14) & 3 != 0 {
                                s |= 2 << 2; // SHST complete
                            }
                            c.csts = s;
                        });
                    }
                    let _ = PropertySize::Four;
                    self.resp(cid, 0, 0, 0);
                }
                _ => self.resp(cid, 0x01, 0, 0),
            }
            return Ok(());
        }
        if self.qid == 0 {
            return self.admin(sqe);
        }
        self.io(sqe, icd)
    }

    fn ctrl<R>(&self, f: impl FnOnce(&Ctrl) -> R) -> R {
        let g = self.sh.ctrls.lock().unwrap();
        let c = &g.iter().find(|(i, _)| *i == self.cntlid).unwrap().1;
        f(c)
    }

    fn ctrl_mut(&self, f: impl FnOnce(&mut Ctrl)) {
        let mut g = self.sh.ctrls.lock().unwrap();
        let c = &mut g.iter_mut().find(|(i, _)| *i == self.cntlid).unwrap().1;
        f(c)
    }

    fn admin(&mut self, sqe: Sqe) -> Result<(), String> {
        let cid = sqe.cid;
        match sqe.opc {
            0x06 => {
                let mut buf = vec![0u8; 4096];
                match sqe.cdw10 & 0xFF {
                    1 => {
                        let mut id = IdentifyController::new_zeroed();
                        id.mn[..4].copy_from_slice(b"FAKE");
                        id.sqes = 0x66;
                        id.cqes = 0x44;
                        id.nn = 1;
                        id.mdts = 5;
                        id.ioccsz = (64 + self.sh.script.icd) / 16;
                        id.iorcsz = 1;
                        buf.copy_from_slice(id.as_bytes());
                    }
                    0 => {
                        let mut ns = IdentifyNamespace::new_zeroed();
                        ns.nsze = NSZE;
                        ns.ncap = NSZE;
                        ns.nuse = NSZE;
                        ns.lbaf[0] = pollux_spec::identify::LbaFormat {
                            ms: self.sh.script.ms,
                            lbads: 9,
                            rp: 0,
                        };
                        buf.copy_from_slice(ns.as_bytes());
                    }
                    2 => buf[..4].copy_from_slice(&1u32.to_le_bytes()),
                    _ => {}
                }
                self.c2h(cid, &buf, false, false, 0);
                self.resp(cid, 0, 0, 0);
            }
            0x09 => {
                // Set Features: Number of Queues: grant 4.
                self.resp(cid, 0, 3 | 3 << 16, 0);
            }
            0x02 if self.discovery && sqe.cdw10 & 0xFF == 0x70 => {
                let len = ((sqe.cdw10 >> 16) + 1) as usize * 4;
                let mut log = pollux_spec::fabrics::DiscoveryLogHeader::new(1, 1)
                    .as_bytes()
                    .to_vec();
                let port = self.s.local_addr().unwrap().port().to_string();
                let e = pollux_spec::fabrics::DiscoveryLogEntry::tcp(
                    pollux_spec::fabrics::subtype::NVM,
                    1,
                    pollux_spec::fabrics::TcpEndpoint {
                        adrfam: pollux_spec::fabrics::adrfam::IPV4,
                        traddr: "127.0.0.1",
                        trsvcid: &port,
                    },
                    SUBNQN,
                    32,
                )
                .unwrap();
                log.extend_from_slice(e.as_bytes());
                log.resize(len, 0);
                self.c2h(cid, &log, false, false, 0);
                self.resp(cid, 0, 0, 0);
            }
            0x02 if !self.discovery && self.sh.script.hold_log_page => {
                let len = ((sqe.cdw10 >> 16) + 1) as usize * 4;
                self.held_log = Some((cid, len));
            }
            0x02 if sqe.cdw10 & 0xFF == 0x03 => {
                // A Firmware Slot log of 64 bytes whatever NUMD asks: a
                // controller that sends only the bytes its log has.
                self.c2h(cid, &[0xA5; 64], false, false, 0);
                self.resp(cid, 0, 0, 0);
            }
            0x18 => {
                self.sh.seen.lock().unwrap().keep_alives += 1;
                self.resp(cid, 0, 0, 0);
            }
            _ => self.resp(cid, 0x01, 0, 0),
        }
        Ok(())
    }

    fn io(&mut self, sqe: Sqe, icd: Vec<u8>) -> Result<(), String> {
        let cid = sqe.cid;
        let slba = sqe.slba();
        let len = sqe.nlb() * 512;
        let sgl = Sgl::from_sqe(&sqe).map_err(|e| format!("SGL: {e:?}"))?;
        match sqe.opc {
            0x01 => {
                let data = if !icd.is_empty() {
                    if !matches!(sgl, Sgl::InCapsule { .. }) {
                        return Err("in-capsule data without an in-capsule SGL".into());
                    }
                    self.sh.seen.lock().unwrap().in_capsule_writes += 1;
                    icd
                } else {
                    if !matches!(sgl, Sgl::Transport { .. }) {
                        return Err(format!("write without data, SGL {sgl:?}"));
                    }
                    let mut d = Vec::new();
                    let mut ttag = 0u16;
                    while (d.len() as u32) < len {
                        let o = d.len() as u32;
                        let l = self.sh.script.r2t_chunk.min(len - o);
                        let r = R2T::new(cid, ttag, o, l, self.digests.header);
                        let layout = PduLayout::new(PduType::R2T, self.digests, 0, 0).unwrap();
                        self.send(&r.as_bytes()[..24], &layout, &[], false);
                        self.sh.seen.lock().unwrap().r2ts += 1;
                        while (d.len() as u32) < o + l {
                            let (h, _, data) = read_pdu(&mut self.s, &self.cfg)?;
                            if let PduHeader::CapsuleCmd(c) = h {
                                self.pending.push_back((c.sqe(), data));
                                continue;
                            }
                            let PduHeader::H2CData(hd) = h else {
                                return Err(format!("expected H2CData, got {h:?}"));
                            };
                            if hd.ttag != ttag || hd.cccid != cid || hd.datao != d.len() as u32 {
                                return Err(format!("bad H2CData {hd:?}"));
                            }
                            self.sh.seen.lock().unwrap().h2c_pdus += 1;
                            d.extend_from_slice(&data);
                        }
                        ttag = ttag.wrapping_add(1);
                    }
                    d
                };
                let off = (slba * 512) as usize;
                self.sh.store.lock().unwrap()[off..off + data.len()].copy_from_slice(&data);
                if self.sh.script.answer_early == Some(cid) {
                    // Answered already.
                    self.sh.seen.lock().unwrap().early_data = data;
                    return Ok(());
                }
                self.resp(cid, 0, 0, 0);
            }
            0x02 => {
                let n = self.sh.reads.fetch_add(1, Ordering::AcqRel) + 1;
                let s = &self.sh.script;
                if s.drop_on_read == Some(n) {
                    self.drop_now = true;
                    return Ok(());
                }
                if s.drop_on_lba == Some(slba) {
                    self.sh.seen.lock().unwrap().poison_reads += 1;
                    self.drop_now = true;
                    return Ok(());
                }
                if s.term_on_read == Some(n) {
                    let t = TermReq::new(Role::Controller, Fes::INVALID_HEADER_FIELD, 2, 0);
                    let _ = self.s.write_all(t.as_bytes());
                    self.drop_now = true;
                    return Ok(());
                }
                self.held.push((cid, slba, len));
                if (self.held.len() as u32) < s.batch_reads {
                    return Ok(());
                }
                let overflow = s.overflow_read == Some(n);
                let corrupt = s.bad_ddgst_read == Some(n);
                let success = s.c2h_success;
                for (cid, slba, len) in std::mem::take(&mut self.held) {
                    let off = (slba * 512) as usize;
                    let data = self.sh.store.lock().unwrap()[off..off + len as usize].to_vec();
                    self.c2h(cid, &data, success, corrupt, if overflow { 512 } else { 0 });
                    if !success {
                        self.resp(cid, 0, 0, 0);
                    }
                }
            }
            _ => self.resp(cid, 0x01, 0, 0),
        }
        Ok(())
    }
}
