//! One runtime thread: its context (what closures, pollers and timers see)
//! and its loop.
//!
//! [`shared`]: what a thread shares with senders on other threads;
//! [`ctx`]: [`ThreadCtx`], its pollers, timers, messages and wake
//! descriptors; [`balance`]: movable pollers and thread 0's scheduler
//! rounds; [`event_loop`]: the loop itself ([`Reactor`]).

mod balance;
mod ctx;
mod event_loop;
mod shared;

pub use ctx::{PollerId, PollerStats, ThreadCtx, ThreadStats, TimerId};
pub(crate) use event_loop::{Prepared, Reactor};
pub(crate) use shared::{lock, External, Shared, ThreadShared};
