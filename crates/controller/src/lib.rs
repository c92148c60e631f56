//! pollux-controller — the NVMe controller model.
//!
//! Module map: `aer` (asynchronous events), `errlog` (the Error
//! Information log).

pub mod aer;
pub mod errlog;
