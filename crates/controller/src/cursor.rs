//! A position in a list of host data segments, for copies in pieces
//! (`store`'s bounce buffers, `stage`'s DMA pieces).
use pollux_bdev::RawSeg as Seg;

/// A position in a segment list, for copies in pieces.
pub(crate) struct Cursor<'a> {
    segs: &'a [Seg],
    i: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    /// At the start of `segs`.
    pub fn new(segs: &'a [Seg]) -> Cursor<'a> {
        Cursor { segs, i: 0, off: 0 }
    }

    /// Moves `n` bytes on (touches no memory).
    pub fn skip(&mut self, mut n: usize) {
        while let Some(s) = self.segs.get(self.i) {
            let here = s.len - self.off;
            if n < here {
                self.off += n;
                return;
            }
            n -= here;
            self.i += 1;
            self.off = 0;
        }
    }

    /// Copies the next `len` bytes of the segments to `dev`, or
    /// (`to_host`) `len` bytes at `dev` into them.
    ///
    /// # Safety
    /// As `NsChan::rw_bounce`; the segments total at least what is left to copy;
    /// `dev` is valid for `len` bytes (for writes unless `to_host`) and
    /// disjoint from host memory.
    unsafe fn copy(&mut self, dev: *mut u8, len: usize, to_host: bool) {
        let mut done = 0;
        while done < len {
            let Some(s) = self.segs.get(self.i) else {
                debug_assert!(false, "segments shorter than the transfer");
                return;
            };
            let n = (s.len - self.off).min(len - done);
            // SAFETY: `off + n <= s.len` bytes of a mapped segment and
            // `done + n <= len` bytes at `dev` (the caller's contract).
            unsafe {
                let host = s.ptr.add(self.off);
                let dev = dev.add(done);
                if to_host {
                    std::ptr::copy_nonoverlapping(dev, host, n)
                } else {
                    std::ptr::copy_nonoverlapping(host, dev, n)
                }
            }
            done += n;
            self.off += n;
            if self.off == s.len {
                self.i += 1;
                self.off = 0;
            }
        }
    }

    /// # Safety
    /// As `copy`.
    pub unsafe fn gather(&mut self, dst: &mut [u8]) {
        // SAFETY: forwarded contract; `dst` is writable for its length.
        unsafe { self.copy(dst.as_mut_ptr(), dst.len(), false) }
    }

    /// # Safety
    /// As `copy`.
    pub unsafe fn scatter(&mut self, src: &[u8]) {
        // SAFETY: forwarded contract; `src` is only read (`to_host`).
        unsafe { self.copy(src.as_ptr().cast_mut(), src.len(), true) }
    }
}

/// Copies the segments' bytes into `dst` (up to `dst.len()`).
///
/// # Safety
/// As `IoQueue::exec`.
pub(crate) unsafe fn copy_from_segs(segs: &[Seg], mut dst: &mut [u8]) {
    for s in segs {
        if dst.is_empty() {
            break;
        }
        let n = s.len.min(dst.len());
        // SAFETY: the segment is valid for `s.len >= n` bytes (the
        // caller's contract); `dst` is ours, disjoint from it.
        unsafe { std::ptr::copy_nonoverlapping(s.ptr, dst.as_mut_ptr(), n) };
        dst = &mut dst[n..];
    }
}
