//! Connection initialization, both ends: the host's ICReq and its check
//! of the controller's ICResp; the controller's answer to an ICReq; and
//! what each end checks received PDUs against afterwards.
use pollux_spec::tcp::{CommonHeader, Digests, IcReq, IcResp, PduHeader, PduType, Role, RxConfig};

/// Largest PDU a host accepts (a C2HData of the largest transfer, and
/// more).
pub const HOST_MAX_PLEN: u32 = 16 << 20;

/// What the two ends agreed on, as the host sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostParams {
    pub digests: Digests,
    /// The controller's PDA (the alignment of data the host sends).
    pub cpda: u8,
    /// Most data bytes in one H2CData PDU.
    pub maxh2cdata: u32,
}

/// The host's ICReq asking for `digests` (HPDA 0; MAXR2T 0: one R2T
/// outstanding per command).
pub fn host_icreq(digests: Digests) -> IcReq {
    IcReq::new(0, digests, 0)
}

/// The length of the first PDU a host receives, from its first 8 bytes
/// (an ICResp, or a Termination Request refusing the connection).
pub fn host_first_pdu_len(first8: &[u8]) -> Result<u32, String> {
    let ch = CommonHeader::read(first8).ok_or_else(|| "short ICResp".to_string())?;
    let layout = ch
        .check(&RxConfig::initial(Role::Host))
        .map_err(|e| format!("bad ICResp: {e}"))?;
    Ok(layout.plen)
}

/// Checks the controller's answer `pdu` (the whole first PDU) to an ICReq
/// that asked for `asked`: the parameters agreed, or why there are none.
pub fn host_icresp(pdu: &[u8], asked: Digests) -> Result<HostParams, String> {
    let cfg = RxConfig::initial(Role::Host);
    let ch = CommonHeader::read(pdu).ok_or_else(|| "short ICResp".to_string())?;
    let layout = ch.check(&cfg).map_err(|e| format!("bad ICResp: {e}"))?;
    let resp = match PduHeader::parse(pdu, &layout, &cfg) {
        Ok(PduHeader::IcResp(r)) => r,
        Ok(PduHeader::TermReq(t)) => {
            return Err(format!(
                "controller refused the connection: Termination Request {} (FEI {:#x})",
                t.fes(),
                t.fei()
            ))
        }
        Ok(other) => return Err(format!("expected ICResp, got {other:?}")),
        Err(e) => return Err(format!("bad ICResp: {e}")),
    };
    let got = resp.digests();
    if got != asked {
        return Err(format!(
            "asked for header digest {} / data digest {}, controller enabled {} / {}",
            on(asked.header),
            on(asked.data),
            on(got.header),
            on(got.data)
        ));
    }
    Ok(HostParams {
        digests: asked,
        cpda: resp.cpda,
        maxh2cdata: resp.maxh2cdata,
    })
}

/// What an established host checks received PDUs against.
pub fn host_rx_config(p: &HostParams) -> RxConfig {
    RxConfig {
        receiver: Role::Host,
        established: true,
        digests: p.digests,
        pda: 0,
        max_plen: HOST_MAX_PLEN,
        maxh2cdata: p.maxh2cdata,
    }
}

/// What a controller offers every host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetLimits {
    /// MAXH2CDATA announced in ICResp.
    pub maxh2cdata: u32,
    /// Most in-capsule data bytes a command capsule may carry (the larger
    /// of the admin and I/O queues' limits: the queue type is not known
    /// until Connect).
    pub icd: u32,
}

/// What the controller agreed to, as it sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetParams {
    pub digests: Digests,
    /// The host's PDA (the alignment of data the controller sends).
    pub hpda: u8,
    /// The host's MAXR2T (0's based).
    pub maxr2t: u32,
}

/// The controller's answer to `req` (it enables the digests the host
/// asked for, CPDA 0), the parameters agreed and what it checks received
/// PDUs against from then on.
pub fn target_icresp(req: &IcReq, limits: &TargetLimits) -> (IcResp, TargetParams, RxConfig) {
    let digests = req.digests();
    let resp = IcResp::new(0, digests, limits.maxh2cdata);
    let mut cfg = RxConfig::initial(Role::Controller);
    cfg.established = true;
    cfg.digests = digests;
    cfg.maxh2cdata = limits.maxh2cdata;
    cfg.max_plen = cfg
        .plen_for(PduType::CapsuleCmd, limits.icd)
        .max(cfg.plen_for(PduType::H2CData, limits.maxh2cdata));
    let params = TargetParams {
        digests,
        hpda: req.hpda,
        maxr2t: req.maxr2t,
    };
    (resp, params, cfg)
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}
