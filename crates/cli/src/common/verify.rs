//! `--verify`: every written logical block starts with a 16-byte tag derived
//! from its LBA; every read checks it. A per-namespace bitmap (one bit per
//! I/O-sized unit, set when a write completes) says which units must carry a
//! tag: a read submitted after a unit was written must see tags; before,
//! zeros (never written) are accepted too. Verification costs per-I/O work
//! (tag writes/checks, an atomic OR per write): it is a correctness mode,
//! not a speed mode.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const KEY: u64 = 0x706f_6c6c_7578_7631; // "polluxv1"
/// Most I/O units a namespace may have in verify mode (bitmap of 512 MiB).
pub const MAX_UNITS: u64 = 1 << 32;

#[inline]
fn tag(lba: u64) -> [u64; 2] {
    [lba ^ KEY, !lba ^ KEY.rotate_left(17)]
}

/// Units of one namespace that have been written, shared by every job on it.
pub struct Written {
    bits: Vec<AtomicU64>,
}

impl Written {
    pub fn new(units: u64) -> Arc<Written> {
        Arc::new(Written {
            bits: (0..units.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    fn set(&self, unit: u64) {
        self.bits[(unit / 64) as usize].fetch_or(1 << (unit % 64), Ordering::Release);
    }
    fn get(&self, unit: u64) -> bool {
        self.bits[(unit / 64) as usize].load(Ordering::Acquire) & (1 << (unit % 64)) != 0
    }
}

pub struct Verify {
    pub written: Arc<Written>,
    pub lba_shift: u8,
    /// Per slot: Some(must_have_tags) for a read in flight, None for a write.
    pub slot_read: Vec<Option<bool>>,
    pub slot_unit: Vec<u64>,
}

pub struct Mismatch {
    pub lba: u64,
    pub what: String,
}

impl Verify {
    pub fn new(written: Arc<Written>, lba_shift: u8, slots: usize) -> Self {
        Verify {
            written,
            lba_shift,
            slot_read: vec![None; slots],
            slot_unit: vec![0; slots],
        }
    }

    /// Before submitting: tag the blocks of a write, or clear the tag area
    /// of a read so stale buffer contents cannot pass.
    pub fn prepare(&mut self, slot: usize, unit: u64, lba: u64, is_read: bool, data: &mut [u8]) {
        let bs = 1usize << self.lba_shift;
        self.slot_unit[slot] = unit;
        for (i, blk) in data.chunks_exact_mut(bs).enumerate() {
            let t = if is_read { [0, 0] } else { tag(lba + i as u64) };
            blk[..8].copy_from_slice(&t[0].to_le_bytes());
            blk[8..16].copy_from_slice(&t[1].to_le_bytes());
        }
        self.slot_read[slot] = if is_read {
            Some(self.written.get(unit))
        } else {
            None
        };
    }

    /// After a successful completion.
    pub fn complete(&mut self, slot: usize, lba: u64, data: &[u8]) -> Result<(), Mismatch> {
        let unit = self.slot_unit[slot];
        let Some(must) = self.slot_read[slot] else {
            self.written.set(unit);
            return Ok(());
        };
        let bs = 1usize << self.lba_shift;
        for (i, blk) in data.chunks_exact(bs).enumerate() {
            let l = lba + i as u64;
            let got = [
                u64::from_le_bytes(blk[..8].try_into().unwrap_or_default()),
                u64::from_le_bytes(blk[8..16].try_into().unwrap_or_default()),
            ];
            if got == tag(l) || (!must && got == [0, 0]) {
                continue;
            }
            let what = if got == [0, 0] {
                "read zeros from a block that was written before the read was submitted".to_string()
            } else if got[0] ^ KEY == !(got[1] ^ KEY.rotate_left(17)) {
                format!("read the data of LBA {} instead", got[0] ^ KEY)
            } else {
                format!("tag mismatch: {:#018x} {:#018x}", got[0], got[1])
            };
            return Err(Mismatch { lba: l, what });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_detect_errors() {
        let w = Written::new(16);
        let mut v = Verify::new(w, 9, 2);
        let mut buf = vec![0u8; 4096];
        v.prepare(0, 3, 24, false, &mut buf);
        assert!(v.complete(0, 24, &buf).is_ok()); // write completes: unit 3 written
        let wbuf = buf.clone();
        // A read of unit 3 must now see tags.
        let mut rbuf = vec![0xAAu8; 4096];
        v.prepare(1, 3, 24, true, &mut rbuf);
        assert!(
            v.complete(1, 24, &rbuf).is_err(),
            "zeroed tag area must fail for a written unit"
        );
        v.prepare(1, 3, 24, true, &mut rbuf);
        assert!(v.complete(1, 24, &wbuf).is_ok());
        // Data from another LBA is named.
        v.prepare(1, 3, 24, true, &mut rbuf);
        let e = v.complete(1, 32, &wbuf).err().unwrap();
        assert_eq!(e.lba, 32);
        assert!(e.what.contains("LBA 24"), "{}", e.what);
        // An unwritten unit may read zeros.
        let mut z = vec![0u8; 4096];
        v.prepare(1, 5, 40, true, &mut z);
        assert!(v.complete(1, 40, &z).is_ok());
    }
}
