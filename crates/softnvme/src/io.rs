//! NVM command set I/O commands: Read, Write, Flush, Write Zeroes and
//! Dataset Management (deallocate), validated against the namespace and
//! executed on its backend.
//!
//! Checks, in order: FUSE/PSDT (fused commands and SGLs are not supported:
//! Invalid Field), opcode, NSID (Invalid Namespace or Format), transfer size
//! vs MDTS (Invalid Field), LBA range (LBA Out of Range), then the PRPs
//! (PRP Offset Invalid / Data Transfer Error). Nothing is transferred unless
//! every check passed. Failures of the namespace's storage (a bdev request
//! refused or completed with an error, a file error) become media errors
//! (Unrecovered Read Error, Write Fault) or Internal Error (deallocate).
//!
//! The Read/Write path allocates nothing: the PRP segments go into the
//! controller's preallocated vector and are lent to the namespace's bdev
//! as they are (see `store`).
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::status::{generic, media};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

use crate::ctrl::Namespace;
use crate::dma::{self, Seg};
use crate::iommu::Iommu;
use crate::stats::Counters;
use crate::store::StoreError;

/// Everything an I/O command may touch (disjoint controller fields).
pub(crate) struct IoCtx<'a> {
    pub ns: &'a mut [Namespace],
    pub iommu: &'a Iommu,
    pub segs: &'a mut Vec<Seg>,
    pub scratch: &'a mut Vec<u8>,
    pub page_size: usize,
    pub max_xfer: usize,
    pub counters: &'a mut Counters,
}

const NSID_ALL: u32 = 0xFFFF_FFFF;
/// Write Zeroes CDW12 bit 25: deallocate.
const WZ_DEAC: u32 = 1 << 25;

#[inline(always)]
fn gen(sc: u8) -> Status {
    Status::generic(sc)
}

/// Executes one I/O command and returns its status.
#[inline]
pub(crate) fn exec(ctx: &mut IoCtx<'_>, sqe: &Sqe) -> Status {
    if sqe.fuse() != 0 || sqe.psdt() != 0 {
        return gen(generic::INVALID_FIELD);
    }
    match sqe.opc {
        x if x == NvmOpcode::Read as u8 => read_write(ctx, sqe, false),
        x if x == NvmOpcode::Write as u8 => read_write(ctx, sqe, true),
        x if x == NvmOpcode::Flush as u8 => flush(ctx, sqe),
        x if x == NvmOpcode::WriteZeroes as u8 => write_zeroes(ctx, sqe),
        x if x == NvmOpcode::DatasetManagement as u8 => dsm(ctx, sqe),
        _ => gen(generic::INVALID_OPCODE),
    }
}

/// The namespace for `nsid` (1-based), if it exists.
#[inline(always)]
fn ns_of(ns: &mut [Namespace], nsid: u32) -> Option<&mut Namespace> {
    ns.get_mut((nsid as usize).wrapping_sub(1))
}

/// `[slba, slba + nlb)` inside a namespace of `nsze` blocks.
#[inline(always)]
fn lba_ok(slba: u64, nlb: u64, nsze: u64) -> bool {
    slba.checked_add(nlb).is_some_and(|end| end <= nsze)
}

#[inline]
fn read_write(ctx: &mut IoCtx<'_>, sqe: &Sqe, write: bool) -> Status {
    let Some(ns) = ns_of(ctx.ns, sqe.nsid) else {
        return gen(generic::INVALID_NAMESPACE);
    };
    let slba = sqe.slba();
    let nlb = sqe.nlb() as u64;
    let len = (nlb << ns.lba_shift) as usize;
    if len > ctx.max_xfer {
        return gen(generic::INVALID_FIELD);
    }
    if !lba_ok(slba, nlb, ns.nsze) {
        return gen(generic::LBA_OUT_OF_RANGE);
    }
    if let Err(e) = dma::map_prps(ctx.iommu, sqe.prp1, sqe.prp2, len, ctx.page_size, ctx.segs) {
        return e.status();
    }
    // SAFETY: the segments were translated just now under the controller
    // lock, which is held until the command is done.
    if let Err(e) = unsafe { ns.store.rw(write, slba, ctx.segs) } {
        return rw_failed(sqe, write, e);
    }
    let c = &mut ctx.counters.s;
    if write {
        c.writes += 1;
        c.bytes_written += len as u64;
    } else {
        c.reads += 1;
        c.bytes_read += len as u64;
    }
    Status::SUCCESS
}

#[cold]
#[inline(never)]
/// (SMART's media error count is the completion path's: `note_error`.)
fn rw_failed(sqe: &Sqe, write: bool, e: StoreError) -> Status {
    let (slba, nlb) = (sqe.slba(), sqe.nlb());
    tracing::error!(nsid = sqe.nsid, slba, nlb, write, error = %e, "namespace I/O failed");
    Status::media(if write {
        media::WRITE_FAULT
    } else {
        media::UNRECOVERED_READ_ERROR
    })
}

fn flush(ctx: &mut IoCtx<'_>, sqe: &Sqe) -> Status {
    let result = if sqe.nsid == NSID_ALL {
        ctx.ns.iter_mut().try_for_each(|n| n.store.flush())
    } else {
        match ns_of(ctx.ns, sqe.nsid) {
            Some(ns) => ns.store.flush(),
            None => return gen(generic::INVALID_NAMESPACE),
        }
    };
    match result {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            tracing::error!(nsid = sqe.nsid, error = %e, "flush failed");
            Status::media(media::WRITE_FAULT)
        }
    }
}

fn write_zeroes(ctx: &mut IoCtx<'_>, sqe: &Sqe) -> Status {
    let Some(ns) = ns_of(ctx.ns, sqe.nsid) else {
        return gen(generic::INVALID_NAMESPACE);
    };
    let slba = sqe.slba();
    let nlb = sqe.nlb() as u64;
    if !lba_ok(slba, nlb, ns.nsze) {
        return gen(generic::LBA_OUT_OF_RANGE);
    }
    let dealloc = sqe.cdw12 & WZ_DEAC != 0;
    match ns.store.zero(slba, nlb, dealloc) {
        Ok(()) => Status::SUCCESS,
        Err(e) => {
            tracing::error!(nsid = sqe.nsid, slba, nlb, error = %e, "write zeroes failed");
            Status::media(media::WRITE_FAULT)
        }
    }
}

fn dsm(ctx: &mut IoCtx<'_>, sqe: &Sqe) -> Status {
    let Some(ns) = ns_of(ctx.ns, sqe.nsid) else {
        return gen(generic::INVALID_NAMESPACE);
    };
    // NR is 8 bits, 0's based: at most 256 ranges (DSM_MAX_RANGES).
    let nr = (sqe.cdw10 & 0xFF) as usize + 1;
    let len = nr * core::mem::size_of::<DsmRange>();
    if let Err(e) = dma::map_prps(ctx.iommu, sqe.prp1, sqe.prp2, len, ctx.page_size, ctx.segs) {
        return e.status();
    }
    ctx.scratch.clear();
    ctx.scratch.resize(len, 0);
    dma::copy_from_host(ctx.segs, ctx.scratch);
    let ranges = ctx
        .scratch
        .chunks_exact(16)
        .filter_map(|b| DsmRange::read_from_bytes(b).ok());
    // Validate every range before touching any.
    for r in ranges.clone() {
        if !lba_ok(r.slba, r.nlb as u64, ns.nsze) {
            return gen(generic::LBA_OUT_OF_RANGE);
        }
    }
    if sqe.cdw11 & DSM_ATTR_DEALLOCATE == 0 {
        return Status::SUCCESS; // hints only
    }
    for r in ranges {
        if r.nlb == 0 {
            continue;
        }
        if let Err(e) = ns.store.zero(r.slba, r.nlb as u64, true) {
            tracing::error!(nsid = sqe.nsid, slba = r.slba, error = %e, "deallocate failed");
            return gen(generic::INTERNAL_ERROR);
        }
    }
    Status::SUCCESS
}
