//! What the tools share: options and their checks (`opts`), core lists
//! (`cores`), the I/O pattern, latency clock and figures, data
//! verification and repeated errors of the benchmarks (`pattern`, `clock`,
//! `latency`, `verify`, `errlog`) and memory sizes (`mem`). No
//! tool imports from another tool's module.
pub(crate) mod clock;
pub(crate) mod cores;
pub(crate) mod errlog;
pub(crate) mod latency;
pub(crate) mod mem;
pub(crate) mod opts;
pub(crate) mod pattern;
pub(crate) mod verify;
