//! What happens to an I/O that failed on a path: the rule of the module
//! docs (reads at once; writes once their first sending is known to be
//! over), as pure functions of the error and of the path's state, so the
//! rule is tested apart from any transport.
use pollux_nvme::IoError;
use pollux_spec::status::{path, sct};

/// Most times one I/O is sent again (Linux's nvme_max_retries): then its
/// path error is the caller's, so a status that every path returns cannot
/// loop forever.
pub(crate) const MAX_RESENDS: u8 = 5;

/// What to do with a failed I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not a path error (or nothing to send again): the caller's.
    Deliver,
    /// Send it again on another path now. `down`: the path itself failed
    /// (skip it until it comes back); `ana`: its ANA state is to be read
    /// again.
    Now { down: bool, ana: bool },
    /// A write that may still be at the controller: send it again once
    /// the path is fenced ([`fence`]). The path is down.
    AfterFence,
    /// A write whose path failed without stopping: never sent again.
    Fail,
}

/// The verdict for an I/O (`write` or a read) that failed with `e` on a
/// path whose controller `may_still_transfer`; `has_buf`: the completion
/// handed its buffer back (without it there is nothing to send again).
pub(crate) fn classify(
    e: IoError,
    write: bool,
    may_still_transfer: bool,
    has_buf: bool,
) -> Verdict {
    if !has_buf {
        return Verdict::Deliver;
    }
    match e {
        // The connection was closed (fast-fail) or the controller disabled
        // (reset) before the core failed the command: over.
        IoError::FastFail | IoError::ControllerReset => Verdict::Now {
            down: true,
            ana: false,
        },
        IoError::ControllerFailed if !may_still_transfer => Verdict::Now {
            down: true,
            ana: false,
        },
        IoError::ControllerFailed if write => Verdict::Fail,
        IoError::ControllerFailed => Verdict::Now {
            down: true,
            ana: false,
        },
        IoError::Nvme(st) if st.sct() == sct::PATH && !st.dnr() => match st.sc() {
            // The controller answered: the command is over.
            path::ANA_INACCESSIBLE | path::ANA_PERSISTENT_LOSS | path::ANA_TRANSITION => {
                Verdict::Now {
                    down: false,
                    ana: true,
                }
            }
            // The controller answered, with a pathing error of its own.
            path::CONTROLLER_PATHING_ERROR | path::INTERNAL_PATH_ERROR => Verdict::Now {
                down: false,
                ana: false,
            },
            // Made up by the host, which gave up on the command: it may
            // still be at the controller.
            path::HOST_PATHING_ERROR | path::ABORTED_BY_HOST => {
                if write {
                    Verdict::AfterFence
                } else {
                    Verdict::Now {
                        down: true,
                        ana: false,
                    }
                }
            }
            _ => Verdict::Deliver,
        },
        _ => Verdict::Deliver,
    }
}

/// A path as the fence sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PathView {
    /// Commands of this queue pair on the path not yet completed.
    pub in_flight: usize,
    /// Completed resets of its controller.
    pub resets: u32,
    pub failed: bool,
    pub may_still_transfer: bool,
}

/// Whether a parked write may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Not yet.
    Wait,
    /// The first sending is over: send it again.
    Go,
    /// The controller failed without stopping: fail the write.
    Fail,
}

/// A write parked when its path had completed `resets_then` resets: it may
/// go once the path's queue pair has nothing in flight and its controller
/// was reset since (the association of the first sending is gone), or
/// once the controller has failed for good having stopped.
pub(crate) fn fence(resets_then: u32, v: PathView) -> Fence {
    if v.failed {
        return if v.may_still_transfer {
            Fence::Fail
        } else {
            Fence::Go
        };
    }
    if v.in_flight == 0 && v.resets > resets_then {
        Fence::Go
    } else {
        Fence::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_spec::Status;

    fn st(sc: u8) -> IoError {
        IoError::Nvme(Status::new(sct::PATH, sc, false))
    }

    #[test]
    fn reads_go_again_at_once_on_every_path_error() {
        for e in [
            IoError::FastFail,
            IoError::ControllerReset,
            IoError::ControllerFailed,
            st(path::HOST_PATHING_ERROR),
            st(path::ABORTED_BY_HOST),
            st(path::ANA_INACCESSIBLE),
        ] {
            assert!(
                matches!(classify(e, false, true, true), Verdict::Now { .. }),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_write_that_may_still_be_at_the_controller_waits_for_the_fence() {
        for sc in [path::HOST_PATHING_ERROR, path::ABORTED_BY_HOST] {
            assert_eq!(classify(st(sc), true, false, true), Verdict::AfterFence);
        }
        for sc in [path::CONTROLLER_PATHING_ERROR, path::INTERNAL_PATH_ERROR] {
            assert!(matches!(
                classify(st(sc), true, false, true),
                Verdict::Now { down: false, .. }
            ));
        }
        // Answered by the controller, or torn down by the host: at once.
        assert!(matches!(
            classify(st(path::ANA_INACCESSIBLE), true, false, true),
            Verdict::Now {
                down: false,
                ana: true
            }
        ));
        for e in [IoError::FastFail, IoError::ControllerReset] {
            assert!(matches!(
                classify(e, true, false, true),
                Verdict::Now { down: true, .. }
            ));
        }
        // Failed having stopped: at once; without stopping: never.
        assert!(matches!(
            classify(IoError::ControllerFailed, true, false, true),
            Verdict::Now { down: true, .. }
        ));
        assert_eq!(
            classify(IoError::ControllerFailed, true, true, true),
            Verdict::Fail
        );
    }

    #[test]
    fn other_errors_and_dnr_are_the_callers() {
        let media = IoError::Nvme(Status::media(0x81));
        assert_eq!(classify(media, true, false, true), Verdict::Deliver);
        let dnr = IoError::Nvme(Status::new(sct::PATH, path::ANA_INACCESSIBLE, true));
        assert_eq!(classify(dnr, false, false, true), Verdict::Deliver);
        assert_eq!(
            classify(IoError::Timeout, false, false, true),
            Verdict::Deliver
        );
        // No buffer back: nothing to send again.
        assert_eq!(
            classify(IoError::FastFail, false, false, false),
            Verdict::Deliver
        );
    }

    /// The fence holds a write while the path still has commands in
    /// flight, and while its controller has not been reset since: sending
    /// it again then could run it twice, or let the first sending land
    /// after a later write to the same blocks.
    #[test]
    fn the_fence_holds_while_the_first_sending_may_run() {
        let v = |in_flight, resets| PathView {
            in_flight,
            resets,
            failed: false,
            may_still_transfer: false,
        };
        assert_eq!(fence(3, v(2, 3)), Fence::Wait, "in flight, no reset");
        assert_eq!(fence(3, v(2, 4)), Fence::Wait, "reset, still in flight");
        assert_eq!(fence(3, v(0, 3)), Fence::Wait, "drained, no reset");
        assert_eq!(fence(3, v(0, 4)), Fence::Go);
        let gone = |may| PathView {
            in_flight: 1,
            resets: 3,
            failed: true,
            may_still_transfer: may,
        };
        assert_eq!(fence(3, gone(false)), Fence::Go);
        assert_eq!(fence(3, gone(true)), Fence::Fail);
    }
}
