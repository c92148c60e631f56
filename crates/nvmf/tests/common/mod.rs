//! A test-only NVMe/TCP host speaking PDUs built with pollux_spec, and a
//! target on a RAM bdev.
#![allow(dead_code)]
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use pollux_bdev::Bdev;
use pollux_nvmf::{RuntimeOptions, SubsystemConfig, Target, TargetConfig};
use pollux_spec::fabrics::{
    ConnectCmd, ConnectData, PropertyGetCmd, PropertySetCmd, PropertySize, SglDescriptor,
    CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
};
use pollux_spec::tcp::{
    write_header, CapsuleCmd, CommonHeader, DataDigest, Digests, H2CData, IcReq, IcResp, PduHeader,
    PduLayout, Role, RxConfig, TermReq,
};
use pollux_spec::{Cqe, NvmOpcode, Sqe};
use zerocopy::IntoBytes;

pub const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
pub const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";
pub const SUB1: &str = "nqn.2024-01.io.pollux:sub1";

/// A target with one subsystem (`SUB1`, any host) on a RAM bdev of
/// `blocks` 512-byte blocks, listening on a free loopback port.
pub fn ram_target(blocks: u64) -> Target {
    ram_target_with(blocks, pollux_nvmf::TransportOptions::default(), &[0])
}

/// The target's socket implementations: the tests of what each must do
/// run on every one.
pub const SOCK_IMPLS: [pollux_nvmf::SockImpl; 2] =
    [pollux_nvmf::SockImpl::Posix, pollux_nvmf::SockImpl::Uring];

/// As [`ram_target`], on socket implementation `si`.
pub fn ram_target_on(blocks: u64, si: pollux_nvmf::SockImpl) -> Target {
    let o = pollux_nvmf::TransportOptions {
        sock_impl: si,
        ..Default::default()
    };
    ram_target_with(blocks, o, &[0])
}

pub fn ram_target_with(
    blocks: u64,
    opts: pollux_nvmf::TransportOptions,
    cores: &[usize],
) -> Target {
    let mut cfg = TargetConfig {
        transport: opts,
        ..Default::default()
    };
    cfg.bdevs.push(Bdev::ram("Malloc0", 512, blocks).unwrap());
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    Target::start(cfg, cores, RuntimeOptions::default()).unwrap()
}

pub fn start(cfg: TargetConfig) -> Target {
    Target::start(cfg, &[0], RuntimeOptions::default()).unwrap()
}

pub struct Client {
    pub s: TcpStream,
    pub dg: Digests,
    pub rx: RxConfig,
    pub cid: u16,
    pub maxh2c: u32,
}

pub enum Pdu {
    Resp(Cqe),
    C2H {
        cccid: u16,
        datao: u32,
        data: Vec<u8>,
        last: bool,
        success: bool,
    },
    R2T {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    Term(TermReq),
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            s,
            dg: Digests::NONE,
            rx: RxConfig::initial(Role::Host),
            cid: 0,
            maxh2c: 4096,
        }
    }

    /// ICReq/ICResp with `dg`.
    pub fn ic(&mut self, dg: Digests) -> IcResp {
        let r = IcReq::new(0, dg, 0);
        self.s.write_all(r.as_bytes()).unwrap();
        let PduHeader::IcResp(resp) = self.recv_hdr().0 else {
            panic!("expected ICResp");
        };
        self.dg = resp.digests();
        self.rx.established = true;
        self.rx.digests = self.dg;
        self.rx.max_plen = 1 << 24;
        self.maxh2c = resp.maxh2cdata;
        resp
    }

    pub fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    /// Sends a command capsule with in-capsule data `icd`.
    pub fn capsule(&mut self, sqe: &Sqe, icd: &[u8]) {
        let (h, l) = CapsuleCmd::new(sqe, icd.len() as u32, self.dg, 0).unwrap();
        self.send_pdu(h.as_bytes(), &l, icd);
    }

    pub fn send_pdu(&mut self, header: &[u8], l: &PduLayout, data: &[u8]) {
        let mut out = vec![0u8; l.plen as usize];
        let n = write_header(header, l, &mut out).unwrap();
        out[n..n + data.len()].copy_from_slice(data);
        if l.ddgst {
            let mut d = DataDigest::new();
            d.update(data);
            let e = n + data.len();
            out[e..e + 4].copy_from_slice(&d.value().to_le_bytes());
        }
        self.s.write_all(&out).unwrap();
    }

    fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).unwrap();
        v
    }

    /// One PDU header (checked as a host checks it) and its data.
    pub fn recv_hdr(&mut self) -> (PduHeader, Vec<u8>) {
        let first = self.read_exact(8);
        let ch = CommonHeader::read(&first).unwrap();
        let l = ch
            .check(&self.rx)
            .unwrap_or_else(|e| panic!("bad PDU from target: {e}"));
        let mut all = first;
        all.extend(self.read_exact(l.plen as usize - 8));
        let h = PduHeader::parse(&all, &l, &self.rx).unwrap();
        let data = all[l.data_range()].to_vec();
        if let Some(r) = l.data_digest_range() {
            let mut d = DataDigest::new();
            d.update(&data);
            assert_eq!(all[r], d.value().to_le_bytes(), "data digest from target");
        }
        (h, data)
    }

    pub fn recv(&mut self) -> Pdu {
        match self.recv_hdr() {
            (PduHeader::CapsuleResp(r), _) => Pdu::Resp(r.cqe),
            (PduHeader::C2HData(c), data) => Pdu::C2H {
                cccid: c.cccid,
                datao: c.datao,
                data,
                last: c.last(),
                success: c.success(),
            },
            (PduHeader::R2T(r), _) => Pdu::R2T {
                cccid: r.cccid,
                ttag: r.ttag,
                r2to: r.r2to,
                r2tl: r.r2tl,
            },
            (PduHeader::TermReq(t), _) => Pdu::Term(t),
            (other, _) => panic!("unexpected PDU {other:?}"),
        }
    }

    pub fn resp(&mut self) -> Cqe {
        match self.recv() {
            Pdu::Resp(c) => c,
            Pdu::Term(t) => panic!("TermReq FES {:?} FEI {}", t.fes(), t.fei()),
            _ => panic!("expected a response capsule"),
        }
    }

    /// The target's C2HTermReq, then end of stream.
    pub fn expect_term(&mut self) -> TermReq {
        let t = match self.recv() {
            Pdu::Term(t) => t,
            Pdu::Resp(c) => panic!("expected TermReq, got a response {:?}", c),
            _ => panic!("expected TermReq"),
        };
        self.expect_eof();
        t
    }

    pub fn expect_eof(&mut self) {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("expected end of stream: {e}"),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn connect_cmd(
        &mut self,
        qid: u16,
        sqsize: u16,
        kato: u32,
        cntlid: u16,
        sub: &str,
        host: &str,
        flow_off: bool,
    ) -> Cqe {
        let mut c = ConnectCmd::new(
            qid,
            sqsize,
            if flow_off { CATTR_DISABLE_SQ_FLOW } else { 0 },
            kato,
        );
        c.cid = self.next_cid();
        // An empty `host` sends an empty HOSTNQN (as SPDK's host does when
        // given none), which ConnectData::new refuses to build.
        let mut d = ConnectData::new(
            [7; 16],
            cntlid,
            sub,
            if host.is_empty() { "x" } else { host },
        )
        .unwrap();
        if host.is_empty() {
            d.hostnqn = [0; 256];
        }
        self.capsule(&c.to_sqe(), d.as_bytes());
        self.resp()
    }

    pub fn admin_connect(&mut self, sub: &str, host: &str, kato: u32) -> Cqe {
        self.connect_cmd(0, 31, kato, CNTLID_DYNAMIC, sub, host, false)
    }

    pub fn prop_get(&mut self, ofst: u32, size: PropertySize) -> Cqe {
        let mut c = PropertyGetCmd::new(ofst, size);
        c.cid = self.next_cid();
        self.capsule(&c.to_sqe(), &[]);
        self.resp()
    }

    pub fn prop_set(&mut self, ofst: u32, value: u64) -> Cqe {
        let mut c = PropertySetCmd::new(ofst, PropertySize::Four, value);
        c.cid = self.next_cid();
        self.capsule(&c.to_sqe(), &[]);
        self.resp()
    }

    /// A command whose data comes back (Identify, Get Log Page): data, then
    /// the completion (None when the target used SUCCESS).
    pub fn data_cmd(&mut self, mut sqe: Sqe, len: u32) -> (Vec<u8>, Option<Cqe>) {
        sqe.cid = self.next_cid();
        SglDescriptor::tcp_transport(len).write_to_sqe(&mut sqe);
        self.capsule(&sqe, &[]);
        let mut data = Vec::new();
        loop {
            match self.recv() {
                Pdu::C2H {
                    cccid,
                    datao,
                    data: d,
                    last,
                    success,
                } => {
                    assert_eq!(cccid, sqe.cid);
                    assert_eq!(datao as usize, data.len());
                    data.extend(d);
                    if success {
                        assert!(last);
                        return (data, None);
                    }
                }
                Pdu::Resp(c) => {
                    assert_eq!(c.cid, sqe.cid);
                    return (data, Some(c));
                }
                Pdu::Term(t) => panic!("TermReq FES {:?} FEI {}", t.fes(), t.fei()),
                Pdu::R2T { .. } => panic!("unexpected R2T"),
            }
        }
    }

    /// Admin Connect, CC.EN = 1, waits for CSTS.RDY; returns the CNTLID.
    pub fn bring_up(&mut self, sub: &str, host: &str, kato: u32) -> u16 {
        let c = self.admin_connect(sub, host, kato);
        assert_eq!(c.status(), pollux_spec::Status::SUCCESS, "admin connect");
        let cntlid = c.dw0 as u16;
        let cc = pollux_spec::regs::Cc::standard(0).with_en(true);
        assert!(self.prop_set(0x14, cc.0 as u64).status().is_success());
        let csts = self.prop_get(0x1C, PropertySize::Four);
        assert_eq!(csts.dw0 & 1, 1, "CSTS.RDY");
        cntlid
    }

    /// Writes `data` at `slba` (in the capsule, or through R2T).
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8], in_capsule: bool) -> Cqe {
        let nlb = (data.len() / 512) as u32;
        let mut sqe = Sqe::rw(NvmOpcode::Write, nsid, slba, nlb);
        sqe.cid = self.next_cid();
        if in_capsule {
            SglDescriptor::in_capsule(0, data.len() as u32).write_to_sqe(&mut sqe);
            self.capsule(&sqe, data);
            return self.resp();
        }
        SglDescriptor::tcp_transport(data.len() as u32).write_to_sqe(&mut sqe);
        self.capsule(&sqe, &[]);
        let (ttag, r2to, r2tl) = match self.recv() {
            Pdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => {
                assert_eq!(cccid, sqe.cid);
                (ttag, r2to, r2tl)
            }
            Pdu::Resp(c) => return c,
            _ => panic!("expected R2T"),
        };
        assert_eq!(r2to, 0);
        assert_eq!(r2tl as usize, data.len());
        let chunk = self.maxh2c.min(32 << 10) as usize;
        let mut off = 0;
        while off < data.len() {
            let n = chunk.min(data.len() - off);
            let last = off + n == data.len();
            let (h, l) =
                H2CData::new(sqe.cid, ttag, off as u32, n as u32, last, self.dg, 0).unwrap();
            self.send_pdu(h.as_bytes(), &l, &data[off..off + n]);
            off += n;
        }
        self.resp()
    }

    pub fn read(&mut self, nsid: u32, slba: u64, len: usize) -> (Vec<u8>, Option<Cqe>) {
        let sqe = Sqe::rw(NvmOpcode::Read, nsid, slba, (len / 512) as u32);
        self.data_cmd(sqe, len as u32)
    }

    /// Number of Queues (Set Features) then I/O queue `qid` on `cntlid`
    /// over a new connection.
    pub fn io_queue(
        addr: SocketAddr,
        dg: Digests,
        cntlid: u16,
        qid: u16,
        host: &str,
        flow_off: bool,
    ) -> Client {
        let mut c = Client::connect(addr);
        c.ic(dg);
        let r = c.connect_cmd(qid, 63, 0, cntlid, SUB1, host, flow_off);
        assert!(r.status().is_success(), "I/O connect: {:#x}", r.status().0);
        c
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
