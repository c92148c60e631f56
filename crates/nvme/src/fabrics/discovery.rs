//! Reading a discovery controller's Discovery Log Page over any fabric.
use std::time::Duration;

use pollux_spec::fabrics::{DiscoveryLogEntry, DiscoveryLogHeader, PropertySize, LID_DISCOVERY};
use pollux_spec::regs::{self, Cc, Csts};
use pollux_spec::Sqe;
use zerocopy::FromBytes;

use crate::error::{Error, Result};
use crate::fabrics::link::AdminLink;
use crate::fabrics::wire::Fabric;

/// Reads the Discovery Log Page (0x70) of the discovery controller on
/// `link`'s association: enable, Get Log Page (header, then every entry),
/// disable.
pub fn discover<F: Fabric>(l: &AdminLink<F>) -> Result<Vec<DiscoveryLogEntry>> {
    l.write(regs::off::CC, PropertySize::Four, Cc::standard(0).0 as u64)?;
    l.write(
        regs::off::CC,
        PropertySize::Four,
        Cc::standard(0).with_en(true).0 as u64,
    )?;
    let to = regs::Cap(l.cap).timeout_ms().max(500);
    let start = std::time::Instant::now();
    loop {
        let csts = Csts(l.read(regs::off::CSTS, PropertySize::Four)? as u32);
        if csts.rdy() {
            break;
        }
        if csts.cfs() {
            return Err(Error::ControllerFatal);
        }
        if start.elapsed().as_millis() as u64 > to {
            return Err(Error::Timeout {
                what: "discovery controller CSTS.RDY=1",
                ms: to,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let hdr_len = std::mem::size_of::<DiscoveryLogHeader>() as u32;
    let get = |len: u32| {
        l.exec_in(
            Sqe::get_log_page(LID_DISCOVERY, 0, len, 0, 0, 0),
            len,
            "Get Log Page (Discovery)",
        )
    };
    let head = get(hdr_len)?;
    let h: DiscoveryLogHeader =
        read_as(&head).ok_or_else(|| Error::Platform("short discovery log header".into()))?;
    let n = h.numrec.min(1024) as u32;
    let entry = std::mem::size_of::<DiscoveryLogEntry>() as u32;
    let all = get(hdr_len + n * entry)?;
    let mut out = Vec::new();
    for i in 0..n as usize {
        let at = hdr_len as usize + i * entry as usize;
        if let Some(e) = all.get(at..).and_then(read_as::<DiscoveryLogEntry>) {
            out.push(e);
        }
    }
    l.shutdown();
    Ok(out)
}

/// Reads a value of `T` from the start of `bytes`.
fn read_as<T: FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(t, _)| t)
}
