//! The admin link over a scripted fabric: a controller in memory that
//! answers each capsule as it is sent, so Connect, properties, resets,
//! reconnects and Keep Alive are driven without a wire.
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pollux_auth::{CtrlAuth, CtrlConfig};
use pollux_spec::fabrics::fabrics_sc;
use pollux_spec::fabrics::{
    fabrics_status, set_property_value, AuthCmd, ConnectCmd, ConnectData, FcType, PropertyGetCmd,
    PropertySetCmd, PropertySize, AUTHREQ_ATR, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
};
use pollux_spec::regs::{self, Cc, Csts};
use pollux_spec::{Cqe, Sqe, Status};
use zerocopy::FromBytes;

use super::*;

mod auth;

const SUBNQN: &str = "nqn.2026-01.io.pollux:scripted";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

/// The scripted controller, shared by its connections.
#[derive(Default)]
struct Ctl {
    cc: u32,
    /// Each Connect seen: QID, CNTLID asked for, CATTR, KATO, subsystem NQN.
    connects: Vec<(u16, u16, u8, u32, String)>,
    next_cntlid: u16,
    /// Refuse an I/O Connect that asks to disable SQ flow control.
    refuse_sqflow_disable: bool,
    /// Answer Keep Alive.
    answer_ka: bool,
    keep_alives: u32,
    /// Connections opened (attempts).
    opens: u32,
    /// Opens that fail before one succeeds again.
    fail_opens: u32,
    /// How long a failing open takes.
    open_delay: Duration,
    /// Connections of earlier generations are dead (`kill`).
    gen: u32,
    /// DH-HMAC-CHAP: the controller's side (None: Authentication
    /// Send/Receive are refused as an unknown command).
    auth: Option<Arc<CtrlConfig>>,
    /// Set AUTHREQ.ATR in Connect responses.
    atr: bool,
    /// Each authentication transaction that ended: QID, host accepted.
    auths: Vec<(u16, bool)>,
}

#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<Ctl>>);

impl Scripted {
    fn ctl(&self) -> std::sync::MutexGuard<'_, Ctl> {
        self.0.lock().unwrap()
    }

    /// Every open connection dies (the controller went away).
    fn kill(&self) {
        self.ctl().gen += 1;
    }
}

struct Conn {
    ctl: Scripted,
    gen: u32,
    /// Failed: seen on the wire (`kill`) or expired.
    dead: bool,
    answers: VecDeque<(u16, Cqe, Option<Vec<u8>>)>,
    /// The queue this connection carries (from its Connect).
    qid: u16,
    /// The controller's side of the authentication on this queue.
    ctrl_auth: Option<CtrlAuth>,
    /// The AUTH message the next Authentication Receive returns.
    recv: Option<Vec<u8>>,
}

fn ok(wcid: u16, dw0: u32) -> Cqe {
    Cqe {
        dw0,
        cid: wcid,
        ..Cqe::default()
    }
}

impl Conn {
    /// Fails the connection if the controller went away (as a socket
    /// finds out when it is used).
    fn check_dead(&mut self) -> bool {
        if self.gen != self.ctl.ctl().gen {
            self.dead = true;
        }
        self.dead
    }

    /// The controller's answer to a capsule (None: no answer).
    fn answer(&mut self, wcid: u16, sqe: Sqe, data: CapsuleData<'_>) -> Option<Cqe> {
        let mut c = self.ctl.ctl();
        match FcType::of(&sqe) {
            Some(FcType::Connect) => {
                let cmd = ConnectCmd::from_sqe(&sqe);
                let CapsuleData::Bytes(b) = data else {
                    panic!("Connect without data")
                };
                let d = ConnectData::read_from_bytes(b).unwrap();
                c.connects.push((
                    cmd.qid,
                    d.cntlid,
                    cmd.cattr,
                    cmd.kato,
                    d.subnqn().unwrap().to_string(),
                ));
                if cmd.qid > 0 && cmd.cattr & CATTR_DISABLE_SQ_FLOW != 0 && c.refuse_sqflow_disable
                {
                    let st = fabrics_status(fabrics_sc::CONNECT_INVALID_PARAMETERS);
                    return Some(Cqe {
                        status: st.0 << 1,
                        ..ok(wcid, 0)
                    });
                }
                let cntlid = if d.cntlid == CNTLID_DYNAMIC {
                    c.next_cntlid += 1;
                    c.next_cntlid
                } else {
                    d.cntlid
                };
                self.qid = cmd.qid;
                let authreq = if c.atr { AUTHREQ_ATR as u32 } else { 0 };
                Some(ok(wcid, cntlid as u32 | authreq << 16))
            }
            Some(FcType::AuthenticationSend) => {
                let cmd = AuthCmd::from_sqe(&sqe);
                assert!(cmd.is_dhchap_protocol());
                let CapsuleData::Bytes(m) = data else {
                    panic!("Authentication Send without data")
                };
                assert_eq!(cmd.len as usize, m.len(), "TL");
                let Some(cfg) = c.auth.clone() else {
                    let st = Status::generic(pollux_spec::status::generic::INVALID_OPCODE);
                    return Some(Cqe {
                        status: st.0 << 1,
                        ..ok(wcid, 0)
                    });
                };
                let qid = self.qid;
                match pollux_auth::msg::message_id(m) {
                    Some((0, 0)) => {
                        let mut a = CtrlAuth::new(cfg);
                        self.recv = Some(a.negotiate(m).unwrap_or_else(|e| {
                            c.auths.push((qid, false));
                            a.failure1(&e).unwrap()
                        }));
                        self.ctrl_auth = Some(a);
                    }
                    Some((1, 2)) => {
                        let a = self.ctrl_auth.as_mut().expect("negotiated");
                        self.recv = Some(a.reply(m).unwrap_or_else(|e| a.failure1(&e).unwrap()));
                        if !a.awaits_success2() {
                            c.auths.push((qid, a.is_done()));
                        }
                    }
                    Some((1, 4)) => {
                        let a = self.ctrl_auth.as_mut().expect("negotiated");
                        c.auths.push((qid, a.success2(m).is_ok()));
                    }
                    Some((0, 0xF0)) => c.auths.push((qid, false)),
                    o => panic!("unexpected AUTH message {o:?}"),
                }
                Some(ok(wcid, 0))
            }
            Some(FcType::AuthenticationReceive) => {
                assert!(AuthCmd::from_sqe(&sqe).is_dhchap_protocol());
                Some(ok(wcid, 0))
            }
            Some(FcType::PropertyGet) => {
                let p = PropertyGetCmd::from_sqe(&sqe);
                let v = match p.ofst as usize {
                    regs::off::CAP => 0x0000_0020_0000_03ff, // MQES 1023
                    regs::off::CC => c.cc as u64,
                    regs::off::CSTS => Cc(c.cc).en() as u64,
                    _ => 0,
                };
                let mut cqe = ok(wcid, 0);
                set_property_value(&mut cqe, v);
                Some(cqe)
            }
            Some(FcType::PropertySet) => {
                let p = PropertySetCmd::from_sqe(&sqe);
                if p.ofst as usize == regs::off::CC {
                    c.cc = p.value as u32;
                }
                Some(ok(wcid, 0))
            }
            _ if sqe.opc == KEEP_ALIVE_OPCODE => {
                c.keep_alives += 1;
                c.answer_ka.then(|| ok(wcid, 0))
            }
            _ => Some(ok(wcid, 0)),
        }
    }
}

impl Connection for Conn {
    fn send(&mut self, wcid: u16, sqe: Sqe, data: CapsuleData<'_>) -> Result<()> {
        if self.check_dead() {
            return Err(Error::Platform("dead".into()));
        }
        if let Some(cqe) = self.answer(wcid, sqe, data) {
            let bounce = match data {
                CapsuleData::Bounce(len) => Some(match self.recv.take() {
                    Some(mut m) => {
                        m.resize(len as usize, 0);
                        m
                    }
                    None => vec![0xC3; len as usize],
                }),
                _ => None,
            };
            self.answers.push_back((wcid, cqe, bounce));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn poll<G: FnMut(u16, Cqe, Option<Vec<u8>>)>(&mut self, f: &mut G) -> (u32, Result<()>) {
        if self.check_dead() {
            return (0, Err(Error::Platform("dead".into())));
        }
        let mut n = 0;
        while let Some((w, c, d)) = self.answers.pop_front() {
            f(w, c, d);
            n += 1;
        }
        (n, Ok(()))
    }

    fn exchange(
        &mut self,
        wcid: u16,
        sqe: Sqe,
        data: CapsuleData<'_>,
        _timeout: Duration,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.send(wcid, sqe, data)?;
        match self.answers.pop_back() {
            Some((_, c, d)) => Ok((c, d.unwrap_or_default())),
            None => Err(Error::Platform(format!("no answer to {what}"))),
        }
    }

    fn forget(&mut self, wcid: u16) {
        self.answers.retain(|a| a.0 != wcid);
    }

    fn forget_all(&mut self) {
        self.answers.clear();
    }

    fn is_dead(&self) -> bool {
        self.dead
    }

    fn expire(&mut self, _what: &str) {
        self.dead = true;
    }

    fn has_rx(&self) -> bool {
        !self.answers.is_empty()
    }

    fn wait(&self, timeout: Duration) {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }
}

impl Fabric for Scripted {
    type Conn = Conn;
    const NAME: &'static str = "scripted";
    const ADMIN_ICD: u32 = 8192;

    fn addr(&self) -> &dyn fmt::Display {
        &"scripted"
    }

    fn open(&self, _qid: u16, _slots: usize) -> Result<Conn> {
        let (delay, fail, gen) = {
            let mut c = self.ctl();
            c.opens += 1;
            let fail = c.fail_opens > 0;
            if fail {
                c.fail_opens -= 1;
            }
            (c.open_delay, fail, c.gen)
        };
        if fail {
            std::thread::sleep(delay);
            return Err(Error::Platform("connection refused".into()));
        }
        Ok(Conn {
            ctl: self.clone(),
            gen,
            dead: false,
            answers: VecDeque::new(),
            qid: 0,
            ctrl_auth: None,
            recv: None,
        })
    }

    unsafe fn host_bytes<'a>(&self, _addr: u64, _len: usize) -> &'a [u8] {
        unreachable!("no core commands with data here")
    }

    unsafe fn copy_to_host(&self, _addr: u64, _bytes: &[u8]) {
        unreachable!("no core commands with data here")
    }
}

fn opts() -> FabricsOptions {
    FabricsOptions {
        subnqn: SUBNQN.into(),
        hostnqn: HOSTNQN.into(),
        hostid: [7; 16],
        kato_ms: 5000,
        ctrl_loss_tmo: Some(Duration::from_secs(30)),
        reconnect_delay: Duration::from_millis(10),
        fast_io_fail_tmo: None,
        admin_timeout: Duration::from_millis(200),
        sq_flow: false,
        auth: Default::default(),
    }
}

fn link(f: &Scripted, o: FabricsOptions) -> AdminLink<Scripted> {
    AdminLink::connect(f.clone(), o).expect("connect")
}

/// The controller goes away and the link finds out (a register read, as
/// the core's reset does first).
fn lose(f: &Scripted, l: &AdminLink<Scripted>) {
    f.kill();
    let csts = l.read(regs::off::CSTS, PropertySize::Four).unwrap();
    assert_eq!(csts, Csts::CFS as u64);
    assert!(l.lost.load(Ordering::Acquire));
}

#[test]
fn admin_connect_asks_for_a_new_controller_with_kato_and_reads_cap() {
    let f = Scripted::default();
    let l = link(&f, opts());
    assert_eq!(l.cntlid(), 1);
    assert_eq!(l.cap & 0xffff, 0x3ff);
    assert_eq!(l.max_queue_entries(), 1024);
    let c = f.ctl();
    assert_eq!(
        c.connects,
        vec![(0, CNTLID_DYNAMIC, 0, 5000, SUBNQN.into())]
    );
}

#[test]
fn bad_names_and_a_zero_reconnect_delay_are_refused_before_connecting() {
    let f = Scripted::default();
    let mut o = opts();
    o.subnqn = "nqn.with\ta.tab".into();
    assert!(matches!(
        AdminLink::connect(f.clone(), o),
        Err(Error::InvalidArgument(_))
    ));
    let mut o = opts();
    o.reconnect_delay = Duration::ZERO;
    assert!(matches!(
        AdminLink::connect(f.clone(), o),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(f.ctl().opens, 0);
}

#[test]
fn io_queues_name_the_controller_and_ask_to_disable_sq_flow_control() {
    let f = Scripted::default();
    let l = link(&f, opts());
    let (_, got) = l.connect_queue(1, 128, l.cntlid(), 127).unwrap();
    assert_eq!(got, 1);
    f.ctl().refuse_sqflow_disable = true;
    l.connect_queue(2, 128, l.cntlid(), 127).unwrap();
    let c = f.ctl();
    // QID 1 asked once; QID 2 was refused and asked again without it.
    let io: Vec<_> = c.connects[1..]
        .iter()
        .map(|c| (c.0, c.1, c.2, c.3))
        .collect();
    assert_eq!(
        io,
        vec![
            (1, 1, CATTR_DISABLE_SQ_FLOW, 0),
            (2, 1, CATTR_DISABLE_SQ_FLOW, 0),
            (2, 1, 0, 0)
        ]
    );
}

#[test]
fn sq_flow_kept_when_asked() {
    let f = Scripted::default();
    let mut o = opts();
    o.sq_flow = true;
    let l = link(&f, o);
    l.connect_queue(1, 64, l.cntlid(), 63).unwrap();
    assert_eq!(f.ctl().connects[1].2, 0);
}

#[test]
fn disabling_ends_the_association_and_enabling_connects_a_new_one() {
    let f = Scripted::default();
    let l = link(&f, opts());
    let en = Cc::standard(0).with_en(true).0 as u64;
    l.write(regs::off::CC, PropertySize::Four, en).unwrap();
    assert_eq!(l.read(regs::off::CSTS, PropertySize::Four).unwrap(), 1);
    l.write(regs::off::CC, PropertySize::Four, 0).unwrap();
    // No association: disabled and not ready, not fatal.
    assert_eq!(l.read(regs::off::CC, PropertySize::Four).unwrap(), 0);
    assert_eq!(l.read(regs::off::CSTS, PropertySize::Four).unwrap(), 0);
    assert!(!l.lost.load(Ordering::Acquire));
    // Enabling needs a connection: the reset's attach_admin makes one.
    assert!(l.write(regs::off::CC, PropertySize::Four, en).is_err());
    l.ensure().unwrap();
    assert_eq!(l.cntlid(), 2);
    l.write(regs::off::CC, PropertySize::Four, en).unwrap();
    assert_eq!(l.read(regs::off::CSTS, PropertySize::Four).unwrap(), 1);
}

#[test]
fn a_lost_association_reads_fatal_until_reconnected() {
    let f = Scripted::default();
    let l = link(&f, opts());
    f.kill();
    assert!(!l.lost.load(Ordering::Acquire));
    assert_eq!(
        l.read(regs::off::CSTS, PropertySize::Four).unwrap(),
        Csts::CFS as u64
    );
    assert!(l.lost.load(Ordering::Acquire));
    // While lost, CAP still answers (read once).
    assert_eq!(l.read(regs::off::CAP, PropertySize::Eight).unwrap(), l.cap);
    l.ensure().unwrap();
    assert!(!l.lost.load(Ordering::Acquire));
    assert_eq!(l.read(regs::off::CSTS, PropertySize::Four).unwrap(), 0);
}

#[test]
fn reconnect_retries_every_delay_then_gives_up_after_ctrl_loss_tmo() {
    let f = Scripted::default();
    let mut o = opts();
    o.ctrl_loss_tmo = Some(Duration::from_millis(45));
    let l = link(&f, o);
    lose(&f, &l);
    f.ctl().fail_opens = u32::MAX;
    let e = l.ensure().unwrap_err();
    assert!(e.to_string().contains("ctrl_loss_tmo"), "{e}");
    // At 0, 10, 20, 30 and 40 ms; 50 is past the 45 ms.
    let n = l.attempts.load(Ordering::Relaxed);
    assert_eq!(n, 5, "{n} attempts");
    assert!(!l.reconnecting.load(Ordering::Acquire));
}

/// Runs `f` with every log event recorded (so the arguments of each are
/// evaluated, as under the CLI's subscriber): a global subscriber, since
/// a thread's own would not reliably reach call sites other tests have
/// already seen without one.
fn logged<R>(f: impl FnOnce() -> R) -> R {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_test_writer()
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
    });
    f()
}

#[test]
fn an_attempt_slower_than_reconnect_delay_is_followed_by_the_next_at_once() {
    logged(|| {
        let f = Scripted::default();
        let l = link(&f, opts());
        lose(&f, &l);
        {
            let mut c = f.ctl();
            c.fail_opens = 2;
            // Each failing attempt takes longer than the 10 ms delay: the
            // next is due at once (none missed), and there is no wait
            // before it (the time left to it was a subtraction that
            // overflowed: a panic under a subscriber).
            c.open_delay = Duration::from_millis(30);
        }
        l.ensure().unwrap();
        assert_eq!(l.attempts.load(Ordering::Relaxed), 3);
    })
}

#[test]
fn fast_io_fail_is_raised_while_reconnecting_and_cleared_after() {
    let f = Scripted::default();
    let mut o = opts();
    o.reconnect_delay = Duration::from_millis(40);
    o.fast_io_fail_tmo = Some(Duration::from_millis(15));
    let l = Arc::new(link(&f, o));
    lose(&f, &l);
    f.ctl().fail_opens = 2;
    let l2 = l.clone();
    let t = std::thread::spawn(move || l2.ensure());
    let mut seen = false;
    for _ in 0..400 {
        if l.fail_fast.load(Ordering::Acquire) {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    t.join().unwrap().unwrap();
    assert!(seen, "fail_fast never raised");
    assert!(!l.fail_fast.load(Ordering::Acquire));
}

#[test]
fn keep_alive_unanswered_within_kato_loses_the_association() {
    let f = Scripted::default();
    let mut o = opts();
    o.kato_ms = 20;
    f.ctl().answer_ka = true;
    let l = link(&f, o);
    l.keep_alive();
    l.keep_alive();
    assert_eq!(f.ctl().keep_alives, 2);
    assert!(!l.lost.load(Ordering::Acquire));
    f.ctl().answer_ka = false;
    l.keep_alive(); // answers the last one, sends one that goes unanswered
    l.keep_alive(); // too early to tell
    assert!(!l.lost.load(Ordering::Acquire));
    std::thread::sleep(Duration::from_millis(25));
    l.keep_alive();
    assert!(l.lost.load(Ordering::Acquire));
    assert_eq!(
        l.read(regs::off::CSTS, PropertySize::Four).unwrap(),
        Csts::CFS as u64
    );
}

#[test]
fn keep_alive_thread_runs_every_half_kato_and_stops_when_dropped() {
    let f = Scripted::default();
    let mut o = opts();
    o.kato_ms = 20;
    f.ctl().answer_ka = true;
    let l = Arc::new(link(&f, o));
    let ka = crate::fabrics::keepalive::KeepAlive::start(&l).expect("KATO set");
    std::thread::sleep(Duration::from_millis(100));
    drop(ka);
    let n = f.ctl().keep_alives;
    assert!(n >= 3, "{n} Keep Alives in 100 ms at KATO 20 ms");
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(f.ctl().keep_alives, n);
    let mut o = opts();
    o.kato_ms = 0;
    assert!(crate::fabrics::keepalive::KeepAlive::start(&Arc::new(link(&f, o))).is_none());
}

#[test]
fn core_commands_on_a_lost_link_complete_with_host_pathing_error() {
    let f = Scripted::default();
    let l = link(&f, opts());
    l.push(3, Sqe::new(0x06, 0), 0, 0).unwrap();
    let mut got = Vec::new();
    l.reap(8, &mut |t, s, _| got.push((t, s)));
    assert_eq!(got, vec![(3, 0)]);
    f.kill();
    let _ = l.read(regs::off::CSTS, PropertySize::Four);
    l.push(4, Sqe::new(0x06, 0), 0, 0).unwrap();
    got.clear();
    l.reap(8, &mut |t, s, _| got.push((t, s)));
    assert_eq!(got, vec![(4, path_error())]);
    assert_eq!(Status(path_error()).sct(), pollux_spec::status::sct::PATH);
}
