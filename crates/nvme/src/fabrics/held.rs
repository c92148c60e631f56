//! I/O held across a reconnect: the commands outstanding on a queue when
//! its connection was lost go again on the new one (the core keeps their
//! trackers and buffers: `Transport::reconnects`), as Linux's and SPDK's
//! fabrics hosts retry them; but a command that brings the connection
//! down each time it is sent (a controller bug) fails instead of looping
//! forever.
use pollux_spec::status::{path, sct};
use pollux_spec::Status;

/// Most times a command is sent again after resets (Linux's
/// nvme_max_retries).
pub const MAX_RETRIES: u8 = 5;

/// A command outstanding at a reset that was sent `tries` times again
/// already: the count it goes with on the new connection, or `None` when
/// it has had its retries and completes with [`aborted_status`] instead.
#[inline]
pub fn retry(tries: u8) -> Option<u8> {
    (tries < MAX_RETRIES).then_some(tries + 1)
}

/// The status of a command given up after [`MAX_RETRIES`]: Command
/// Aborted By Host (a path error, as Linux's host fails it).
pub fn aborted_status() -> u16 {
    Status::new(sct::PATH, path::ABORTED_BY_HOST, false).0
}

/// Host Pathing Error: what a command gets when its connection is lost.
pub fn path_error() -> u16 {
    Status::new(sct::PATH, path::HOST_PATHING_ERROR, false).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_retries_then_aborted() {
        let mut tries = 0;
        let mut sent = 1;
        while let Some(t) = retry(tries) {
            tries = t;
            sent += 1;
        }
        assert_eq!(tries, MAX_RETRIES);
        assert_eq!(sent, 1 + MAX_RETRIES as u32);
        let st = Status(aborted_status());
        assert_eq!(st.sct(), sct::PATH);
        assert_eq!(st.sc(), path::ABORTED_BY_HOST);
        assert_eq!(Status(path_error()).sct(), sct::PATH);
    }
}
