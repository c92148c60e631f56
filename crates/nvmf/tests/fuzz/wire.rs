//! A socket in memory: what the host model writes, what the target sends.
use std::cell::Cell;
use std::io;
use std::net::Shutdown;

use pollux_nvmf::testing::Wire;

// ----------------------------------------------------------------------
// The wire
// ----------------------------------------------------------------------

/// A socket in memory.
pub(crate) struct MemWire {
    pub(crate) inp: Vec<u8>,
    pub(crate) pos: usize,
    /// The host closed its side (after `inp`).
    pub(crate) eof: bool,
    /// The host reset the connection.
    pub(crate) reset: bool,
    pub(crate) out: Vec<u8>,
    /// Most bytes `out` holds (the host's unread data): the send buffer.
    pub(crate) room: usize,
    /// The target shut down its sending side (FIN) / both sides.
    pub(crate) shut_wr: Cell<bool>,
    pub(crate) shut_rd: Cell<bool>,
    /// Send calls after our FIN (must stay 0).
    pub(crate) after_fin: u32,
}

impl MemWire {
    pub(crate) fn new(room: usize) -> MemWire {
        MemWire {
            inp: Vec::new(),
            pos: 0,
            eof: false,
            reset: false,
            out: Vec::new(),
            room,
            shut_wr: Cell::new(false),
            shut_rd: Cell::new(false),
            after_fin: 0,
        }
    }

    pub(crate) fn push(&mut self, b: &[u8]) {
        if self.pos == self.inp.len() {
            self.inp.clear();
            self.pos = 0;
        }
        self.inp.extend_from_slice(b);
    }
}

impl Wire for MemWire {
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
        if self.reset {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if self.shut_rd.get() {
            return Ok(Some(0));
        }
        let avail = self.inp.len() - self.pos;
        if avail == 0 {
            return Ok(if self.eof { Some(0) } else { None });
        }
        let n1 = avail.min(first.len());
        first[..n1].copy_from_slice(&self.inp[self.pos..self.pos + n1]);
        self.pos += n1;
        let n2 = (avail - n1).min(second.len());
        second[..n2].copy_from_slice(&self.inp[self.pos..self.pos + n2]);
        self.pos += n2;
        Ok(Some(n1 + n2))
    }

    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        if self.reset {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if self.shut_wr.get() {
            self.after_fin += 1;
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut sent = 0;
        for v in iov {
            let room = self.room.saturating_sub(self.out.len());
            let n = v.iov_len.min(room);
            if n == 0 {
                break;
            }
            // SAFETY: the caller's contract (`Wire::send_iov`): the iovec
            // describes `iov_len >= n` readable bytes valid for the call.
            let b = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, n) };
            self.out.extend_from_slice(b);
            sent += n;
            if n < v.iov_len {
                break;
            }
        }
        Ok(sent)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.shut_wr.set(true);
        if how == Shutdown::Both {
            self.shut_rd.set(true);
        }
        Ok(())
    }
}
