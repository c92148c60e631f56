//! Fabrics Connect: every queue of an association starts with one, on a
//! connection of its own (QID 0 with CNTLID 0xFFFF makes a new controller;
//! an I/O queue names the controller ID the admin Connect returned).
use pollux_spec::fabrics::{fabrics_sc, ConnectCmd, ConnectData, CATTR_DISABLE_SQ_FLOW};
use pollux_spec::status::sct;
use pollux_spec::Cqe;
use zerocopy::IntoBytes;

use crate::error::{Error, Result};
use crate::fabrics::auth::authenticate;
use crate::fabrics::options::FabricsOptions;
use crate::fabrics::refused::ConnectRefused;
use crate::fabrics::wire::{CapsuleData, Connection, Fabric};

/// Opens a connection for queue `qid` and sends Connect (`cntlid`:
/// 0xFFFF for the admin queue), then authenticates the queue when needed
/// (`auth`), returning it and the controller ID.
///
/// I/O queues ask the controller to disable SQ flow control (it then
/// ends a read with C2HData's SUCCESS flag instead of a response
/// capsule; the host never needs SQHD: its trackers keep it within
/// the queue); a controller that refuses that CATTR bit is asked again
/// without it.
pub(crate) fn connect_queue<F: Fabric>(
    fabric: &F,
    opts: &FabricsOptions,
    qid: u16,
    sq_entries: u16,
    cntlid: u16,
    slots: usize,
) -> Result<(F::Conn, u16)> {
    let once = |cattr| connect_once(fabric, opts, qid, sq_entries, cntlid, slots, cattr);
    if qid == 0 || opts.sq_flow {
        return once(0);
    }
    match once(CATTR_DISABLE_SQ_FLOW) {
        Err(e) if refused_cattr(&e) => {
            tracing::debug!(addr = %fabric.addr(), qid, "SQ flow control disable refused; connecting with it");
            once(0)
        }
        r => r,
    }
}

/// Connect refused with Connect Invalid Parameters (as for a CATTR bit the
/// controller does not support).
fn refused_cattr(e: &Error) -> bool {
    matches!(e, Error::ConnectRefused(r)
        if r.status.sct() == sct::COMMAND_SPECIFIC
            && r.status.sc() == fabrics_sc::CONNECT_INVALID_PARAMETERS)
}

fn connect_once<F: Fabric>(
    fabric: &F,
    opts: &FabricsOptions,
    qid: u16,
    sq_entries: u16,
    cntlid: u16,
    slots: usize,
    cattr: u8,
) -> Result<(F::Conn, u16)> {
    let mut conn = fabric.open(qid, slots)?;
    let (cmd, data) = capsule(opts, qid, sq_entries, cntlid, cattr)?;
    let (cqe, _) = conn.exchange(
        0,
        cmd.to_sqe(),
        CapsuleData::Bytes(data.as_bytes()),
        opts.admin_timeout,
        "Connect",
    )?;
    let got = answer(fabric, opts, &cmd, &data, &cqe)?;
    authenticate(
        &mut conn,
        fabric.addr(),
        opts,
        qid,
        got,
        (cqe.dw0 >> 16) as u16,
    )?;
    Ok((conn, got))
}

/// The Connect command and its data for queue `qid` (KATO only on the
/// admin queue).
pub(crate) fn capsule(
    opts: &FabricsOptions,
    qid: u16,
    sq_entries: u16,
    cntlid: u16,
    cattr: u8,
) -> Result<(ConnectCmd, ConnectData)> {
    let kato = if qid == 0 { opts.kato_ms } else { 0 };
    let cmd = ConnectCmd::new(qid, sq_entries - 1, cattr, kato);
    let data = ConnectData::new(opts.hostid, cntlid, &opts.subnqn, &opts.hostnqn)
        .map_err(|e| Error::InvalidArgument(format!("NQN: {e}")))?;
    Ok((cmd, data))
}

/// Checks Connect's answer: the controller ID on success; a refusal
/// names what was asked (the address, the NQNs, the queue).
pub(crate) fn answer<F: Fabric>(
    fabric: &F,
    opts: &FabricsOptions,
    cmd: &ConnectCmd,
    data: &ConnectData,
    cqe: &Cqe,
) -> Result<u16> {
    let st = cqe.status();
    let qid = cmd.qid;
    if !st.is_success() {
        let r = ConnectRefused {
            addr: fabric.addr().to_string(),
            subnqn: opts.subnqn.clone(),
            hostnqn: opts.hostnqn.clone(),
            qid,
            sq_entries: cmd.queue_entries() as u16,
            cntlid: data.cntlid,
            cattr: cmd.cattr,
            kato_ms: cmd.kato,
            status: st,
            dw0: cqe.dw0,
        };
        // (Debug: the error goes to the caller, who reports it.)
        tracing::debug!(dw0 = format_args!("{:#x}", cqe.dw0), "{r}");
        return Err(Error::ConnectRefused(Box::new(r)));
    }
    let got = cqe.dw0 as u16;
    tracing::debug!(addr = %fabric.addr(), qid, cntlid = got, "connected");
    Ok(got)
}
