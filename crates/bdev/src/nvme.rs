//! The NVMe backend: a namespace through the driver, one I/O queue pair
//! per channel. Requests map one to one onto the queue pair's (which
//! splits what exceeds the controller's transfer size itself); the layer
//! adds only a vector split and the conversion of the completion.
use std::sync::Arc;

use pollux_host::{Controller, Namespace, QpairOptions, QueuePair};

use crate::bdev::ChannelOptions;
use crate::data::Completion;

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
