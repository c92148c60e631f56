//! Multipath: one namespace over several controllers ("paths"), as
//! Linux's native NVMe multipath and SPDK's `bdev_nvme` multipath do it.
//!
//! [`Multipath::new`] takes the controllers (one per transport ID, see
//! [`path_trid`]) and a namespace ID, and refuses paths that do not
//! expose the same namespace: the same subsystem NQN (Identify
//! Controller), the same NGUID, EUI-64 and UUID (Identify Namespace and
//! its Namespace Identification Descriptor list), block size and size.
//! [`Multipath::alloc_qpair`] makes an [`MpQueuePair`] for one thread: a
//! queue pair on every path, and the bookkeeping to move I/O between
//! them. Nothing here is a `dyn` call or an allocation per I/O; a request
//! costs the path choice (a short loop over the paths), a tag taken from
//! a free list, and the one `match` of the path's [`crate::QueuePair`].
//!
//! # Path choice
//! By ANA state first: optimized paths, else non-optimized ones; never an
//! inaccessible, persistent-loss or changing one, nor one whose
//! controller is down. The state is read from the ANA log page at
//! connect, again when an I/O gets an ANA path status (Asymmetric Access
//! Inaccessible, Persistent Loss, Transition), and when a path comes
//! back; and every 65536 polls of a queue pair, for a path whose state
//! makes it unusable (at most every [`PROBE_INTERVAL`]) and for the
//! usable ones (at most every [`ANA_REFRESH`], by whichever queue pair
//! of the paths comes first). A controller without ANA reporting (CMIC
//! bit 3) is optimized. (ANA Change notices, AENs, are not used: the
//! host core does not run Asynchronous Event Requests; the periodic
//! reading is how a usable path, e.g. non-optimized, learns of a better
//! state, or an optimized one of a worse.) Among the best paths, as SPDK's
//! `bdev_nvme_set_multipath_policy`: [`Policy::ActivePassive`] uses the
//! first (in the order given) until it fails; [`Policy::ActiveActive`]
//! spreads I/O by [`Selector::RoundRobin`] or [`Selector::QueueDepth`]
//! (the path with the fewest commands outstanding from this queue pair).
//!
//! # Failover, and the rule for writes
//! An I/O that fails on a path with a path error is sent again on
//! another path, and the caller sees one completion for it, never the
//! error (unless it was sent again five times already, Linux's
//! `nvme_max_retries`: then the error is the caller's); other errors (media errors, invalid fields, ...) are the
//! caller's, as on one path. The path errors: the transport's
//! (`FastFail`, `ControllerReset`, `ControllerFailed`), and NVMe status
//! of the Path Related type without DNR (ANA states; host, controller and
//! internal pathing errors). The transport's and the host's own make the
//! path down; ANA ones make its ANA state be read again.
//!
//! **A read is sent again at once. A write is sent again only once its
//! first sending is known to be over**: either its completion says so —
//! the controller answered it (an NVMe status, ANA and the controller's
//! pathing errors included), or the
//! host core tore the queue down before failing it (`FastFail` and
//! `ControllerReset`: the connection is closed or the controller was
//! disabled; `ControllerFailed` on a controller that stopped, see
//! [`crate::Controller::may_still_transfer`]) — or, when the completion
//! does not say so (Host Pathing Error, Command Aborted By Host: the host
//! gave up on the command, which may still be at the controller), once that path's queue pair has nothing in flight and its
//! controller has been reset since (a new association: the old one's
//! commands are gone), or has failed for good having stopped. A write
//! whose path failed without stopping (`may_still_transfer`) is never
//! sent again: it completes with `ControllerFailed`. So a write is never
//! executed by two paths at once, and a later write to the same blocks on
//! another path cannot be overtaken by the first one arriving late.
//! (`failover.rs` holds the rule and its tests.)
//!
//! A path that failed is skipped until its controller comes back (the
//! host core's reconnect: [`path_trid`] makes NVMe/TCP paths fail their
//! held I/O at once, `fast_io_fail_tmo:0`, unless the transport ID says
//! otherwise, so I/O moves to another path instead of waiting for the
//! reconnect). It is probed at most every [`PROBE_INTERVAL`] while down;
//! when its controller is ready again it takes I/O again. I/O for which
//! no path is usable waits (in flight) until one is; it fails only when
//! every controller has failed for good.
mod failover;
mod ident;
mod paths;
mod qpair;
mod set;

pub use paths::{Policy, Selector, ANA_REFRESH, PROBE_INTERVAL};
pub use qpair::{MpQueuePair, PathStats};
pub use set::{path_trid, Multipath, MultipathError};
