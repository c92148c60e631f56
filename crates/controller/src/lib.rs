//! pollux-controller — the NVMe controller model, one piece of code for
//! every transport: the emulated PCIe controller (`pollux-softnvme`) and
//! the NVMe-oF target run the same admin command set, Identify, log
//! pages, features, asynchronous events and NVM I/O over bdevs; they add
//! only how commands, data and completions travel.
//!
//! Three levels:
//! - [`Subsystem`] (shared by every thread through an `Arc`): identity,
//!   limits, personality ([`Personality::Pcie`] or
//!   [`Personality::Fabrics`]) and namespaces (NSID → bdev).
//! - [`Controller`] (one per PCIe device or fabrics association, used
//!   from one thread at a time): the registers as a state machine
//!   ([`Registers`], [`CcChange`]), features, the Error Information log,
//!   SMART / Health, asynchronous events, and [`Controller::exec_admin`]
//!   returning an [`AdminOutcome`] (complete, data to send, held, or the
//!   transport's own command).
//! - [`IoQueue`] (one per I/O queue, on the queue's thread): one bdev
//!   channel per namespace, following live namespace changes at
//!   [`IoQueue::sync_namespaces`]; [`IoQueue::check`] then [`IoQueue::submit`] /
//!   [`IoQueue::poll`] (asynchronous, tagged) or [`IoQueue::exec`]
//!   (synchronous: the same dispatch, then polled until over). Its counts reach SMART through
//!   [`IoQueue::publish`] (plain stores; no lock, no atomic
//!   read-modify-write on the I/O path).
//!
//! Namespaces are bdevs (`pollux_bdev::Bdev`) of any backend, NVMe
//! namespaces on any transport among them, in one subsystem (the bdev's
//! one `match` per request picks the backend: no `dyn` call per I/O).
//! NVMe namespaces take only their controller's DMA memory: their reads
//! and writes are staged through DMA pieces each queue owns, many
//! commands at once on an asynchronous queue (see `stage`), one at a time
//! on a synchronous one (see `store`).
//!
//! Every field of a command comes from the untrusted host: every path
//! ends in an NVMe status, never a panic.
//!
//! Module map: `subsystem`, `ctrl` (the controller state, register
//! reactions, errors and events), `features` (the values of the features
//! and their defaults), `regs` (CAP/VS/CC/CSTS), `admin` (+ `identify`,
//! `log`, `features`), `aer`, `ana` (ANA states per port), `notice` (changed namespaces per controller), `errlog`, `command` (a checked I/O
//! command), `io` (NVM commands, `IoQueue`; `io::multi`: commands run as
//! several bdev requests, a piece per poll), `completion` (what `poll`
//! makes of a finished request), `store` (a queue's channel to a
//! namespace's bdev, bounce buffer), `stage` (an NVMe namespace's
//! asynchronous DMA staging), `stats` (per-queue counts published for
//! SMART), `user_data` (the layout of the queue's bdev requests'
//! `user_data`), `cursor` (host data segments: copies in pieces),
//! `error`.

pub mod admin;
mod aer;
mod ana;
mod command;
mod completion;
mod ctrl;
mod cursor;
mod errlog;
mod error;
mod features;
mod io;
mod notice;
mod regs;
mod stage;
mod stats;
mod store;
mod subsystem;
mod user_data;

pub use admin::identify::{ns_ids, FABRICS_SGLS};
pub use admin::{AdminEnv, AdminOutcome, AfterSend, ADMIN_XFER_LIMIT};
pub use ana::AnaPort;
pub use command::{IoCmd, IoOp};
pub use ctrl::Controller;
pub use errlog::ERROR_LOG_ENTRIES;
pub use error::ControllerError;
pub use io::{IoQueue, IoQueueOptions};
pub use notice::CHANGED_NS_LIST_ENTRIES;
pub use regs::{CcChange, Registers};
pub use stats::{IoStats, StatsHandle};
pub use subsystem::{
    FabricsTraits, Identity, Limits, Namespace, NsIds, PcieTraits, Personality, Subsystem,
    MAX_MDTS, MAX_NAMESPACES,
};
