//! The NVMe backend over several paths: one namespace through
//! [`pollux_host::Multipath`], one [`MpQueuePair`] (a queue pair on
//! every path) per channel. Reads and writes of one buffer only: the
//! multipath queue pair fails them over between paths; vectors, flags,
//! flush, zeroing, reset and passthrough are refused as unsupported
//! (`Caps` says so).
use std::sync::Arc;

use pollux_host::{MpQueuePair, Multipath, QpairOptions};
use pollux_nvme::IoBuf;
use pollux_spec::cmd::RwFlags;

use super::nvme_refused;
use crate::common::Common;
use crate::data::Data;
use crate::error::{Refused, SubmitError};
use crate::info::{random_uuid, BdevInfo, Caps};
use crate::options::ChannelOptions;

/// The description of `mp`'s namespace as a bdev.
pub(crate) fn describe(name: &str, mp: &Multipath) -> Option<BdevInfo> {
    let ctrl = mp.controller(0)?;
    let qp_ns = mp.namespace();
    // Each path's transfer size may differ: the smallest.
    let max_transfer = (0..mp.len())
        .filter_map(|i| mp.controller(i).map(|c| c.max_transfer()))
        .min()
        .unwrap_or(ctrl.max_transfer());
    Some(BdevInfo {
        name: name.to_string(),
        uuid: random_uuid(),
        block_size: qp_ns.lba_size(),
        num_blocks: qp_ns.nsze(),
        buf_align: 4,
        max_transfer,
        backend: "nvme",
        caps: Caps {
            flush: false,
            write_zeroes: false,
            unmap: false,
            reset: false,
            nvme_passthru: false,
            host_memory: false,
        },
    })
}

pub(crate) struct MpShared {
    pub mp: Arc<Multipath>,
    pub qopts: QpairOptions,
}

pub(crate) fn open(sh: &MpShared, opts: &ChannelOptions) -> Result<MpQueuePair, String> {
    let mut q = opts.nvme.clone().unwrap_or_else(|| sh.qopts.clone());
    q.depth = u16::try_from(opts.depth).unwrap_or(u16::MAX).max(1);
    sh.mp.alloc_qpair(q).map_err(|e| e.to_string())
}

/// Refused as unsupported by this backend.
#[cold]
pub(crate) fn unsupported(c: &Common, op: &'static str) -> SubmitError {
    SubmitError::Unsupported {
        op,
        backend: c.backend,
    }
}

/// A read or write of one buffer on the multipath queue pair (which
/// checks the range and length, as one path's queue pair does).
#[inline(always)]
pub(crate) fn rw(
    c: &Common,
    m: &mut MpQueuePair,
    write: bool,
    lba: u64,
    buf: IoBuf,
    flags: RwFlags,
    ud: u64,
) -> Result<(), Refused> {
    if flags != RwFlags::NONE {
        return Err(Refused::new(
            unsupported(c, "read/write flags on a multipath namespace"),
            Data::One(buf),
        ));
    }
    let nlb = (buf.len() >> c.shift) as u32;
    let r = if write {
        m.write(lba, nlb, buf, ud)
    } else {
        m.read(lba, nlb, buf, ud)
    };
    r.map_err(|r| nvme_refused(r, c.shift))
}
