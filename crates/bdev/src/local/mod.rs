//! The null and RAM backends: requests finish at submission and their
//! completions wait in the channel until the next poll (so a handler
//! never runs inside a submit call).
//!
//! RAM is shared by every channel of the bdev, on any thread, without a
//! lock, so two channels writing the same block at once may race: they
//! must race only as the hardware does (a torn block), never as undefined
//! behaviour. So the store is never reached through a slice: on x86-64
//! every access is a string instruction in inline assembly (`rep movsb`,
//! `rep stosb`), which the processor performs as single-byte accesses,
//! each atomic: a byte-wise atomic copy (C++'s P1478
//! `atomic_load_per_byte_memcpy`), racing as relaxed atomic byte accesses
//! would, at `memcpy`'s speed (a 128 KiB write took twice glibc's
//! `memmove` as a relaxed `AtomicU64` loop, which the compiler cannot
//! vectorise). Elsewhere it is an array of `AtomicU64` copied word by word
//! with relaxed loads and stores.
//!
//! A RAM disk may simulate a volatile write cache (a testing aid for
//! durability: [`VolatileCache`]).
pub(crate) mod config;

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use pollux_nvme::IoBuf;
use pollux_spec::cmd::RwFlags;

use crate::data::{Completion, Data, RawSeg};
use crate::error::{IoError, Refused, SubmitError};
use crate::info::{random_uuid, BdevInfo, Caps};

/// A null (or, with `ram`, RAM) bdev's description.
pub(crate) fn describe(name: &str, block_size: u32, num_blocks: u64, is_ram: bool) -> BdevInfo {
    BdevInfo {
        name: name.to_string(),
        uuid: random_uuid(),
        block_size,
        num_blocks,
        buf_align: 1,
        max_transfer: u32::MAX,
        backend: if is_ram { "ram" } else { "null" },
        caps: Caps {
            flush: true,
            write_zeroes: true,
            unmap: true,
            reset: true,
            nvme_passthru: false,
            host_memory: true,
        },
    }
}

/// A RAM disk's memory: zeroed anonymous pages, reached only by
/// byte-wise atomic copies (see the module docs).
pub(crate) struct RamStore {
    words: NonNull<u64>,
    len: usize,
}

// SAFETY: the memory is only reached through `atomic_copy` and
// `atomic_zero`.
unsafe impl Send for RamStore {}
// SAFETY: as above; their accesses are atomic, so shared access is sound.
unsafe impl Sync for RamStore {}

impl RamStore {
    /// `len` bytes (a multiple of 8), zeroed, reserved lazily by the kernel.
    pub fn new(len: u64) -> std::io::Result<RamStore> {
        let bytes = usize::try_from(len)
            .ok()
            .filter(|l| l % 8 == 0)
            .ok_or_else(|| std::io::Error::other(format!("RAM size {len} is not usable")))?;
        let map_len = bytes.max(1).next_multiple_of(4096);
        // SAFETY: a fresh anonymous private mapping; nothing else is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let words = NonNull::new(p.cast::<u64>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(RamStore { words, len: bytes })
    }

    /// The address of byte `off`; the caller checked `[off, off + len)`
    /// lies within the store.
    #[inline(always)]
    fn at(&self, off: u64, len: usize) -> *mut u8 {
        assert!(
            off.checked_add(len as u64)
                .is_some_and(|end| end <= self.len as u64),
            "RAM access [{off}, +{len}) outside {} bytes",
            self.len
        );
        // SAFETY: within the mapping (asserted).
        unsafe { self.words.as_ptr().cast::<u8>().add(off as usize) }
    }

    #[inline]
    pub fn read(&self, off: u64, dst: &mut [u8]) {
        let p = self.at(off, dst.len());
        // SAFETY: `p` is valid for `dst.len()` bytes of the store (`at`);
        // `dst` is exclusively borrowed and does not overlap the store.
        unsafe { atomic_copy(dst.as_mut_ptr(), p, dst.len()) };
    }

    #[inline]
    pub fn write(&self, off: u64, src: &[u8]) {
        let p = self.at(off, src.len());
        // SAFETY: as `read`; `src` is borrowed and does not overlap the
        // store.
        unsafe { atomic_copy(p, src.as_ptr(), src.len()) };
    }

    /// Zeroes `[off, off + len)`: whole pages are handed back to the
    /// kernel (MADV_DONTNEED: they read as zeroes and take no memory), the
    /// ragged ends are stored byte by byte. A request racing on the same
    /// pages sees either the old data or zeroes, as with a device.
    pub fn zero(&self, off: u64, len: u64) {
        const PAGE: u64 = 4096;
        let end = off + len;
        let (a, b) = (off.next_multiple_of(PAGE), end / PAGE * PAGE);
        if a < b {
            let base = self.at(a, (b - a) as usize);
            // SAFETY: [a, b) lies inside the mapping (`at`); MADV_DONTNEED
            // on private anonymous memory only replaces its pages with
            // zero pages, which every access (all atomic) may observe at
            // any time.
            let r = unsafe { libc::madvise(base.cast(), (b - a) as usize, libc::MADV_DONTNEED) };
            if r == 0 {
                self.store_zero(off, a - off);
                self.store_zero(b, end - b);
                return;
            }
        }
        self.store_zero(off, len);
    }

    fn store_zero(&self, off: u64, len: u64) {
        let p = self.at(off, len as usize);
        // SAFETY: `p` is valid for `len` bytes of the store (`at`).
        unsafe { atomic_zero(p, len as usize) };
    }

    /// Copies `[off, off + len)` of this store into the same range of
    /// `dst` (of the same size).
    fn copy_to(&self, dst: &RamStore, off: u64, len: usize) {
        let (s, d) = (self.at(off, len), dst.at(off, len));
        // SAFETY: both valid for `len` bytes (`at`); two stores are two
        // mappings (a store is never copied to itself: the volatile cache's
        // media is its own).
        unsafe { atomic_copy(d, s, len) };
    }
}

/// Copies `len` bytes from `src` to `dst` as byte-wise atomic accesses
/// (see the module docs): `rep movsb` on x86-64.
///
/// # Safety
/// Both are valid for `len` bytes and do not overlap; store memory is
/// reached only through these functions.
#[inline(always)]
unsafe fn atomic_copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; the direction flag is clear on entry
    // to an asm block (Rust's rule), so the copy goes upward; no flags
    // are changed and no stack is used.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..len {
        // SAFETY: the caller's contract; each byte as a relaxed atomic.
        unsafe {
            let v = (*src.add(i).cast::<std::sync::atomic::AtomicU8>()).load(Relaxed);
            (*dst.add(i).cast::<std::sync::atomic::AtomicU8>()).store(v, Relaxed);
        }
    }
}

/// Zeroes `len` bytes at `dst` as byte-wise atomic stores: `rep stosb` on
/// x86-64.
///
/// # Safety
/// `dst` is valid for `len` bytes; store memory is reached only through
/// these functions.
#[inline(always)]
unsafe fn atomic_zero(dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as `atomic_copy`.
    unsafe {
        std::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") 0u8,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..len {
        // SAFETY: the caller's contract; each byte as a relaxed atomic.
        unsafe { (*dst.add(i).cast::<std::sync::atomic::AtomicU8>()).store(0, Relaxed) };
    }
}

/// A simulated volatile write cache over a RAM disk (a testing aid:
/// `Bdev::ram_with_volatile_cache`). The RAM disk's store is what reads
/// see, cache and media together; `media` is what survives a power loss
/// (`Bdev::lose_volatile_cache`); `dirty` has a bit per block written
/// since it was last committed to `media`. A write (or write zeroes,
/// unmap) stores its data, then marks its blocks; a commit clears a
/// block's bit, then copies it: a write racing with the commit leaves its
/// bit set, so nothing written is ever marked clean uncommitted. Commits:
/// a flush (every dirty block), a FUA write (its blocks, before it
/// completes), a FUA read (its blocks).
pub(crate) struct VolatileCache {
    media: RamStore,
    dirty: Box<[AtomicU64]>,
    shift: u32,
}

impl VolatileCache {
    pub fn new(len: u64, block_size: u32) -> std::io::Result<VolatileCache> {
        let shift = block_size.trailing_zeros();
        let blocks = len >> shift;
        Ok(VolatileCache {
            media: RamStore::new(len)?,
            dirty: (0..blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            shift,
        })
    }

    /// The blocks of `[off, off + len)` (bytes, whole blocks).
    fn blocks(&self, off: u64, len: u64) -> std::ops::Range<u64> {
        (off >> self.shift)..((off + len) >> self.shift)
    }

    /// After the data of `[off, off + len)` was stored in the cache.
    fn wrote(&self, off: u64, len: u64) {
        for b in self.blocks(off, len) {
            self.dirty[(b / 64) as usize].fetch_or(1 << (b % 64), Relaxed);
        }
    }

    /// Commits the dirty blocks of `[off, off + len)`; returns how many.
    fn commit(&self, ram: &RamStore, off: u64, len: u64) -> u64 {
        let bs = 1usize << self.shift;
        let mut n = 0;
        for b in self.blocks(off, len) {
            let bit = 1 << (b % 64);
            if self.dirty[(b / 64) as usize].fetch_and(!bit, Relaxed) & bit != 0 {
                ram.copy_to(&self.media, b << self.shift, bs);
                n += 1;
            }
        }
        n
    }

    /// Commits every dirty block (a flush).
    fn commit_all(&self, ram: &RamStore) {
        self.each_dirty(|b| ram.copy_to(&self.media, b << self.shift, 1 << self.shift));
    }

    /// A power loss: every block not committed gets its media content
    /// back. Returns how many.
    pub fn lose(&self, ram: &RamStore) -> u64 {
        let mut n = 0;
        self.each_dirty(|b| {
            self.media.copy_to(ram, b << self.shift, 1 << self.shift);
            n += 1;
        });
        n
    }

    /// Clears every dirty bit, calling `f` with each block that had one.
    fn each_dirty(&self, mut f: impl FnMut(u64)) {
        for (i, w) in self.dirty.iter().enumerate() {
            if w.load(Relaxed) == 0 {
                continue;
            }
            let mut bits = w.swap(0, Relaxed);
            while bits != 0 {
                let k = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                f(i as u64 * 64 + k);
            }
        }
    }

    /// After a request on `[off, off + len)` moved its data.
    #[cold]
    #[inline(never)]
    fn after(&self, ram: &RamStore, op: LocalOp, off: u64, len: u64) {
        match op {
            LocalOp::Write | LocalOp::Zero => self.wrote(off, len),
            LocalOp::WriteFua => {
                // Every block of it, dirty or not: its data is what was
                // just stored.
                self.wrote(off, len);
                self.commit(ram, off, len);
            }
            LocalOp::ReadFua => {
                self.commit(ram, off, len);
            }
            LocalOp::Flush => self.commit_all(ram),
            LocalOp::Read | LocalOp::None => {}
        }
    }
}

impl Drop for RamStore {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(
                self.words.as_ptr().cast(),
                self.len.max(1).next_multiple_of(4096),
            );
        }
    }
}

/// What the channels of a null or RAM bdev share.
pub(crate) struct LocalShared {
    /// Set by `Bdev::inject_failure`: every outstanding and later request
    /// fails.
    pub failed: AtomicBool,
    /// None: null (moves no data).
    pub ram: Option<RamStore>,
    /// A RAM disk's simulated volatile write cache, if it has one.
    pub cache: Option<VolatileCache>,
}

pub(crate) struct LocalChan {
    done: VecDeque<Completion>,
    depth: u32,
    shared: Arc<LocalShared>,
}

/// What a local request does.
#[derive(Clone, Copy)]
pub(crate) enum LocalOp {
    Read,
    Write,
    /// With Force Unit Access: a difference only with a simulated cache.
    ReadFua,
    WriteFua,
    /// Zero the range (write zeroes, unmap).
    Zero,
    /// Make written data durable.
    Flush,
    /// Nothing to move (reset).
    None,
}

impl LocalOp {
    /// The op of a read (`write` false) or write with `flags`.
    #[inline(always)]
    pub fn rw(write: bool, flags: RwFlags) -> LocalOp {
        match (write, flags.fua()) {
            (false, false) => LocalOp::Read,
            (true, false) => LocalOp::Write,
            (false, true) => LocalOp::ReadFua,
            (true, true) => LocalOp::WriteFua,
        }
    }
}

impl LocalChan {
    pub fn new(shared: Arc<LocalShared>, depth: u32) -> LocalChan {
        LocalChan {
            done: VecDeque::with_capacity(depth as usize),
            depth,
            shared,
        }
    }

    /// Requests submitted and not yet polled.
    pub fn outstanding(&self) -> usize {
        self.done.len()
    }

    /// Executes one request on bytes `[off, off + len)` (already checked
    /// against the bdev) and queues its completion.
    #[inline(always)]
    pub fn submit(
        &mut self,
        op: LocalOp,
        off: u64,
        len: u64,
        mut data: Data,
        user_data: u64,
    ) -> Result<(), Refused> {
        if self.done.len() >= self.depth as usize {
            return Err(Refused::new(
                SubmitError::QueueFull { depth: self.depth },
                data,
            ));
        }
        let sh = &*self.shared;
        if sh.failed.load(Relaxed) {
            return Err(Refused::new(SubmitError::Failed, data));
        }
        if let Some(ram) = &sh.ram {
            move_data(ram, op, off, len, &mut data);
            if let Some(c) = &sh.cache {
                c.after(ram, op, off, len);
            }
        }
        self.done.push_back(Completion {
            user_data,
            result: Ok(0),
            data,
        });
        Ok(())
    }

    /// `submit` for memory the caller lends (see `Io::readv_raw`): the
    /// data moves now, the completion carries no buffer.
    ///
    /// # Safety
    /// Every segment is valid for its length (writable for reads) and
    /// nothing else accesses it during the call.
    #[inline(always)]
    pub unsafe fn submit_raw(
        &mut self,
        write: bool,
        flags: RwFlags,
        off: u64,
        segs: &[RawSeg],
        user_data: u64,
    ) -> Result<(), SubmitError> {
        if self.done.len() >= self.depth as usize {
            return Err(SubmitError::QueueFull { depth: self.depth });
        }
        // SAFETY: forwarded contract.
        unsafe { self.run_raw(write, flags, off, segs)? };
        self.done.push_back(Completion {
            user_data,
            result: Ok(0),
            data: Data::None,
        });
        Ok(())
    }

    /// Executes a borrowed-memory request within the call, queueing no
    /// completion (`Channel::readv_raw_now`).
    ///
    /// # Safety
    /// As `submit_raw`.
    #[inline(always)]
    pub unsafe fn run_raw(
        &mut self,
        write: bool,
        flags: RwFlags,
        off: u64,
        segs: &[RawSeg],
    ) -> Result<(), SubmitError> {
        let sh = &*self.shared;
        if sh.failed.load(Relaxed) {
            return Err(SubmitError::Failed);
        }
        if let Some(ram) = &sh.ram {
            let mut at = off;
            for s in segs {
                if write {
                    // SAFETY: valid for reads for the call.
                    let d = unsafe { std::slice::from_raw_parts(s.ptr, s.len) };
                    ram.write(at, d)
                } else {
                    // SAFETY: the caller's contract: valid, writable,
                    // exclusive for the call.
                    let d = unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) };
                    ram.read(at, d)
                }
                at += s.len as u64;
            }
            if let Some(c) = &sh.cache {
                c.after(ram, LocalOp::rw(write, flags), off, at - off);
            }
        }
        Ok(())
    }

    /// The next finished request.
    #[inline(always)]
    pub fn pop(&mut self) -> Option<Completion> {
        let mut c = self.done.pop_front()?;
        if self.shared.failed.load(Relaxed) {
            c.result = Err(IoError::Failed);
        }
        Some(c)
    }
}

fn move_data(ram: &RamStore, op: LocalOp, off: u64, len: u64, data: &mut Data) {
    let mut at = off;
    let mut each = |b: &mut IoBuf| {
        match op {
            LocalOp::Read | LocalOp::ReadFua => ram.read(at, b.as_mut_slice()),
            LocalOp::Write | LocalOp::WriteFua => ram.write(at, b.as_slice()),
            LocalOp::Zero | LocalOp::Flush | LocalOp::None => {}
        }
        at += b.len() as u64;
    };
    match op {
        LocalOp::Zero => ram.zero(off, len),
        LocalOp::Flush | LocalOp::None => {}
        LocalOp::Read | LocalOp::Write | LocalOp::ReadFua | LocalOp::WriteFua => match data {
            Data::None => {}
            Data::One(b) => each(b),
            Data::Vec(v) => v.iter_mut().for_each(each),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_reads_back_what_was_written_zeroes_and_copies() {
        let s = RamStore::new(64 << 10).unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31 % 253) as u8).collect();
        // Odd offsets and lengths: the copies are byte-wise.
        s.write(4093, &data);
        let mut back = vec![0u8; data.len() + 6];
        s.read(4090, &mut back);
        assert_eq!(&back[..3], &[0, 0, 0], "before the write");
        assert!(back[3..3 + data.len()] == data[..], "the data");
        assert_eq!(&back[3 + data.len()..], &[0, 0, 0], "after it");
        // Zero a range with whole pages and ragged ends.
        s.zero(4100, 12_000);
        s.read(4090, &mut back);
        assert!(back[3..10] == data[..7], "left of the zeroed range");
        assert!(back[10..10 + 12_000].iter().all(|&b| b == 0), "zeroed");
        assert!(back[10 + 12_000..3 + data.len()] == data[7 + 12_000..]);
        let media = RamStore::new(64 << 10).unwrap();
        s.copy_to(&media, 4093, data.len());
        let mut m = vec![0u8; data.len()];
        media.read(4093, &mut m);
        s.read(4093, &mut back[..data.len()]);
        assert!(m == back[..data.len()], "copied");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn an_access_past_the_store_is_refused() {
        let s = RamStore::new(8192).unwrap();
        s.write(8190, &[1, 2, 3]);
    }

    /// Two threads writing the same block while a third reads it: every
    /// byte read is one of the two patterns (the block may tear, as on a
    /// device).
    #[test]
    fn racing_writes_tear_a_block_byte_by_byte_only() {
        let s = Arc::new(RamStore::new(4096).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = [0x11u8, 0xEE]
            .into_iter()
            .map(|v| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    let block = [v; 4096];
                    while !stop.load(Relaxed) {
                        s.write(0, &block);
                    }
                })
            })
            .collect();
        s.write(0, &[0x11; 4096]);
        let mut b = [0u8; 4096];
        for _ in 0..2000 {
            s.read(0, &mut b);
            assert!(b.iter().all(|&x| x == 0x11 || x == 0xEE));
        }
        stop.store(true, Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    }
}
