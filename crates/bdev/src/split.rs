//! Requests the layer splits into several backend requests (a vector on
//! NVMe, write zeroes or unmap beyond one command's reach): a parent slot
//! collects its children's buffers and first error and completes once.
//!
//! A child's user data is `CHILD | parent << 20 | index`: bit 63 is the
//! layer's (callers may not set it), so a child is recognised with one test.
use pollux_nvme::IoBuf;

use crate::data::{Completion, Data};
use crate::error::IoError;

/// The bit of a request's `user_data` the layer keeps for itself (bit
/// 63): a caller's `user_data` never has it (refused:
/// `SubmitError::ReservedUserData`).
pub const USER_DATA_RESERVED: u64 = 1 << 63;
pub(crate) const CHILD: u64 = USER_DATA_RESERVED;
const INDEX_BITS: u32 = 20;
/// Most children of one parent.
pub(crate) const MAX_CHILDREN: usize = 1 << INDEX_BITS;

struct Parent {
    user_data: u64,
    /// Children not yet finished.
    left: u32,
    result: Result<u32, IoError>,
    /// Child buffers, in order, as they come back.
    bufs: Vec<Option<IoBuf>>,
}

#[derive(Default)]
pub(crate) struct Parents {
    slots: Vec<Option<Parent>>,
    free: Vec<u32>,
}

impl Parents {
    /// A parent for `children` requests carrying `bufs` buffers (0 when
    /// they carry none); returns its index.
    pub fn open(&mut self, user_data: u64, children: u32, bufs: usize) -> u32 {
        let p = Parent {
            user_data,
            left: children,
            result: Ok(0),
            bufs: (0..bufs).map(|_| None).collect(),
        };
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(p);
                i
            }
            None => {
                self.slots.push(Some(p));
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub fn child_data(parent: u32, index: usize) -> u64 {
        CHILD | (parent as u64) << INDEX_BITS | index as u64
    }

    /// Child `index` finished (or was never sent: `result` says why) with
    /// its buffer; returns the parent's completion when it was the last.
    pub fn child_done(
        &mut self,
        parent: u32,
        index: usize,
        result: Result<u32, IoError>,
        buf: Option<IoBuf>,
    ) -> Option<Completion> {
        let Some(Some(p)) = self.slots.get_mut(parent as usize) else {
            tracing::error!(parent, index, "completion for an unknown split request");
            return None;
        };
        if let Some(slot) = p.bufs.get_mut(index) {
            *slot = buf;
        }
        if p.result.is_ok() {
            if let Err(e) = result {
                p.result = Err(e);
            }
        }
        p.left -= 1;
        if p.left > 0 {
            return None;
        }
        let p = self.slots[parent as usize].take()?;
        self.free.push(parent);
        let data = if p.bufs.is_empty() {
            Data::None
        } else {
            Data::Vec(Box::new(p.bufs.into_iter().flatten().collect()))
        };
        Some(Completion {
            user_data: p.user_data,
            result: p.result,
            data,
        })
    }

    /// Forgets a parent none of whose children was sent.
    pub fn discard(&mut self, parent: u32) {
        if let Some(slot @ Some(_)) = self.slots.get_mut(parent as usize) {
            *slot = None;
            self.free.push(parent);
        }
    }

    /// A completion whose user data marks it as a child.
    #[inline]
    pub fn on_child(&mut self, c: Completion) -> Option<Completion> {
        let parent = ((c.user_data & !CHILD) >> INDEX_BITS) as u32;
        let index = (c.user_data & ((1 << INDEX_BITS) - 1)) as usize;
        self.child_done(parent, index, c.result, c.data.into_one())
    }

    /// Parents still open.
    pub fn open_count(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}
