//! The Discovery Log Page (LID 70h) of the target's discovery
//! controller: one entry per listener of each subsystem the connecting
//! host may reach, nothing about the others.
use pollux_spec::fabrics::{
    adrfam, subtype, treq, DiscoveryLogEntry, DiscoveryLogHeader, TcpEndpoint,
};
use pollux_spec::status::generic;
use pollux_spec::{Sqe, Status};
use zerocopy::IntoBytes;

use crate::model::Admin;
use crate::shared::Shared;

/// The log page as `hostnqn` sees it.
pub(crate) fn page(shared: &Shared, hostnqn: &str) -> Vec<u8> {
    let mut entries = Vec::new();
    let listeners = shared.listeners();
    // Read under the subsystems' lock: a change comes before or after.
    let subs = shared.subsystems();
    let genctr = shared.genctr.load(std::sync::atomic::Ordering::Relaxed);
    for s in subs.iter().filter(|s| s.allows(hostnqn)) {
        for addr in &s.listeners {
            let portid = listeners
                .iter()
                .position(|l| l == addr)
                .map_or(0, |p| p as u16 + 1);
            let traddr = addr.ip().to_string();
            let trsvcid = addr.port().to_string();
            let ep = TcpEndpoint {
                adrfam: if addr.is_ipv4() {
                    adrfam::IPV4
                } else {
                    adrfam::IPV6
                },
                traddr: &traddr,
                trsvcid: &trsvcid,
            };
            match DiscoveryLogEntry::tcp(
                subtype::NVM,
                portid,
                ep,
                s.model.nqn(),
                shared.opts.max_aq_depth,
            ) {
                Ok(mut e) => {
                    // SQ flow control may be disabled (Linux then asks
                    // for it, and reads end with C2HData SUCCESS).
                    e.treq |= treq::SQ_FLOW_DISABLE;
                    entries.push(e);
                }
                Err(err) => tracing::error!(subsystem = s.model.nqn(), "discovery entry: {err}"),
            }
        }
    }
    drop(subs);
    let mut out = DiscoveryLogHeader::new(genctr, entries.len() as u64)
        .as_bytes()
        .to_vec();
    for e in &entries {
        out.extend_from_slice(e.as_bytes());
    }
    out
}

/// Get Log Page 70h: NUMD and the byte offset (LPOL/LPOU) honoured.
pub(crate) fn log_page(shared: &Shared, hostnqn: &str, sqe: &Sqe) -> Admin {
    let numd = (sqe.cdw10 >> 16) as u64 | ((sqe.cdw11 & 0xFFFF) as u64) << 16;
    let len = (numd + 1) * 4;
    let offset = sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32;
    let page = page(shared, hostnqn);
    if !offset.is_multiple_of(4) || offset > page.len() as u64 {
        return Admin::Complete {
            dw0: 0,
            status: Status::generic(generic::INVALID_FIELD),
        };
    }
    let start = offset as usize;
    let end = (page.len() as u64).min(offset + len) as usize;
    Admin::Data {
        data: page[start..end].to_vec(),
        xfer_len: len as usize,
        then: None,
    }
}
