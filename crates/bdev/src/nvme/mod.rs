//! The NVMe backend: a namespace through the driver, one I/O queue pair
//! per channel. Requests map one to one onto the queue pair's (which
//! splits what exceeds the controller's transfer size itself); the layer
//! adds only a vector split and the conversion of the completion.
pub(crate) mod config;
pub(crate) mod multipath;

use std::sync::Arc;

use pollux_host::{Controller, Namespace, QpairOptions, QueuePair, Submitter};
use pollux_nvme::IoBuf;
use pollux_spec::cmd::RwFlags;

use crate::common::Common;
use crate::data::{Completion, Data};
use crate::error::{IoError, Refused, SubmitError};
use crate::info::{random_uuid, BdevInfo, Caps};
use crate::options::ChannelOptions;
use crate::split::{Parents, MAX_CHILDREN};

/// Most blocks of one NVMe Write Zeroes or deallocate command.
const NVME_MAX_ZERO_BLOCKS: u64 = 65536;

/// The description of namespace `ns` of `ctrl` as a bdev.
pub(crate) fn describe(name: &str, ctrl: &Controller, ns: &Namespace) -> BdevInfo {
    BdevInfo {
        name: name.to_string(),
        uuid: random_uuid(),
        block_size: ns.lba_size(),
        num_blocks: ns.nsze(),
        buf_align: 4,
        max_transfer: ctrl.max_transfer(),
        backend: "nvme",
        caps: Caps {
            flush: true,
            write_zeroes: true,
            unmap: true,
            reset: true,
            nvme_passthru: true,
            host_memory: false,
        },
    }
}

pub(crate) struct NvmeShared {
    pub ctrl: Arc<Controller>,
    pub ns: Namespace,
    pub qopts: QpairOptions,
}

/// The parts of an NVMe channel next to its queue pair (borrowed
/// alongside the queue pair's submitter).
pub(crate) struct NvmeSide {
    pub ns: Namespace,
    pub ctrl: Arc<Controller>,
    /// Completions made by the layer (a reset), delivered at the next poll.
    pub deferred: Vec<Completion>,
}

pub(crate) struct NvmeChan {
    pub qp: QueuePair,
    pub side: NvmeSide,
}

impl NvmeChan {
    pub fn open(sh: &NvmeShared, opts: &ChannelOptions) -> pollux_nvme::error::Result<Self> {
        let mut q = opts.nvme.clone().unwrap_or_else(|| sh.qopts.clone());
        // The queue pair holds what the controller's queues hold (CAP.MQES
        // commands, one entry kept empty); a deeper channel keeps the rest
        // in the queue pair's software backlog.
        q.depth = u16::try_from(opts.depth)
            .unwrap_or(u16::MAX)
            .min(sh.ctrl.cap().mqes())
            .max(1);
        let qp = sh.ctrl.alloc_qpair(q)?;
        Ok(NvmeChan {
            qp,
            side: NvmeSide {
                ns: sh.ns,
                ctrl: sh.ctrl.clone(),
                deferred: Vec::new(),
            },
        })
    }
}

/// A request the driver refused, in the layer's terms, with its buffer.
#[cold]
#[inline(never)]
pub(crate) fn nvme_refused(r: pollux_nvme::Refused, shift: u32) -> Refused {
    Refused::new(from_nvme(r.error, 1 << shift), r.buf.into())
}

/// The same error in the layer's terms where one exists.
#[cold]
pub(crate) fn from_nvme(e: pollux_nvme::SubmitError, block_size: u32) -> SubmitError {
    use pollux_nvme::SubmitError as N;
    match e {
        N::LbaOutOfRange { lba, nlb, nsze } => SubmitError::OutOfRange {
            lba,
            nlb: nlb as u64,
            num_blocks: nsze,
        },
        N::ZeroLength => SubmitError::ZeroLength,
        N::BufferLength { got, .. } if got % block_size as usize != 0 => {
            SubmitError::NotBlockMultiple {
                len: got,
                block_size,
            }
        }
        e => SubmitError::Nvme(e),
    }
}

/// A vector on NVMe: one command per buffer under a parent. If a
/// command is refused after others were sent, the rest are not sent
/// and the parent completes with the error once the sent ones finish.
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit_vec(
    c: &mut Common,
    sub: &mut Submitter<'_>,
    side: &mut NvmeSide,
    write: bool,
    lba: u64,
    bufs: Vec<IoBuf>,
    flags: RwFlags,
    ud: u64,
) -> Result<(), Refused> {
    let n = bufs.len();
    let shift = c.shift;
    let parent = c.parents.open(ud, n as u32, n);
    let mut at = lba;
    let mut it = bufs.into_iter().enumerate();
    while let Some((i, b)) = it.next() {
        let nlb = (b.len() >> shift) as u32;
        let cud = Parents::child_data(parent, i);
        let r = if write {
            sub.write_with(&side.ns, at, nlb, b, flags, cud)
        } else {
            sub.read_with(&side.ns, at, nlb, b, flags, cud)
        };
        at += nlb as u64;
        if let Err(r) = r {
            let error = from_nvme(r.error, 1 << shift);
            if i == 0 {
                // Nothing sent: refuse the whole request.
                let mut back: Vec<IoBuf> = r.buf.into_iter().collect();
                back.extend(it.map(|(_, b)| b));
                c.parents.discard(parent);
                return Err(Refused::new(error, Data::Vec(Box::new(back))));
            }
            tracing::warn!(%error, index = i, "vector request partly refused; failing it");
            let fail = Err(IoError::Failed);
            let mut last = c.parents.child_done(parent, i, fail, r.buf);
            for (j, b) in it.by_ref() {
                last = c.parents.child_done(parent, j, fail, Some(b));
            }
            debug_assert!(last.is_none(), "sent children are still outstanding");
            return Ok(());
        }
    }
    Ok(())
}

/// Write Zeroes or deallocate on NVMe: one command per
/// `NVME_MAX_ZERO_BLOCKS` blocks, under a parent when there are several.
pub(crate) fn zero(
    c: &mut Common,
    sub: &mut Submitter<'_>,
    side: &mut NvmeSide,
    lba: u64,
    nlb: u64,
    ud: u64,
    unmap: bool,
) -> Result<(), SubmitError> {
    let shift = c.shift;
    let chunks = nlb.div_ceil(NVME_MAX_ZERO_BLOCKS);
    if chunks == 1 {
        // One command: no parent.
        let r = if unmap {
            sub.deallocate(&side.ns, lba, nlb as u32, ud)
        } else {
            sub.write_zeroes(&side.ns, lba, nlb as u32, false, ud)
        };
        r.map_err(|e| from_nvme(e, 1 << shift))
    } else if chunks as usize > MAX_CHILDREN {
        Err(SubmitError::TooManySegments {
            n: chunks as usize,
            max: MAX_CHILDREN,
        })
    } else {
        let parent = c.parents.open(ud, chunks as u32, 0);
        let mut sent = 0u64;
        let mut res = Ok(());
        for i in 0..chunks {
            let at = lba + i * NVME_MAX_ZERO_BLOCKS;
            let n = (nlb - i * NVME_MAX_ZERO_BLOCKS).min(NVME_MAX_ZERO_BLOCKS) as u32;
            let cud = Parents::child_data(parent, i as usize);
            let r = if unmap {
                sub.deallocate(&side.ns, at, n, cud)
            } else {
                sub.write_zeroes(&side.ns, at, n, false, cud)
            };
            if let Err(e) = r {
                res = Err(from_nvme(e, 1 << shift));
                break;
            }
            sent += 1;
        }
        if let Err(e) = res {
            if sent == 0 {
                c.parents.discard(parent);
            } else {
                // Some went out: the parent reports the failure
                // once they finish.
                for j in sent..chunks {
                    let f = Err(IoError::Failed);
                    c.parents.child_done(parent, j as usize, f, None);
                }
                tracing::warn!(%e, "zeroing partly refused; failing it");
                res = Ok(());
            }
        }
        res
    }
}
