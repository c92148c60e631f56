//! The `user_data` of the bdev requests an I/O queue makes
//! ([`UserData`]), laid out here and nowhere else:
//!
//! | bits | field |
//! | --- | --- |
//! | 0..32 | the tag: the command's (`IoQueue::submit`'s, below [`KID`]), a multi-request command's request ([`KID`] and the command's slot, `io::multi`), or a staged piece's record (`stage`) |
//! | 32..34 | the [`Kind`] |
//! | 34..62 | blocks: a read's or write's length (for the counts), a staged piece's offset in its command |
//! | 62 | [`UserData::SYNC`]: a request `store` waits for within the call (the rest 0) |
//! | 63 | the bdev layer's ([`USER_DATA_RESERVED`]): never set |
use pollux_bdev::USER_DATA_RESERVED;

/// The tag bit of a multi-request command's bdev requests (`io::multi`;
/// the tags `IoQueue::submit` takes are below it).
pub(crate) const KID: u32 = 1 << 31;

const KIND_SHIFT: u32 = 32;
const BLOCKS_SHIFT: u32 = 34;
const BLOCKS_MASK: u64 = (1 << 28) - 1;

/// What a request is, for its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A command's read (counted).
    Read = 0,
    /// A command's write (counted).
    Write = 1,
    /// Anything else of a command: flush, write zeroes, deallocate.
    Other = 2,
    /// A piece of a staged command (`stage`).
    Part = 3,
}

/// One request's `user_data` (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UserData(u64);

// The fields stay clear of the bdev layer's bit.
const _: () = assert!(((BLOCKS_MASK << BLOCKS_SHIFT) | UserData::SYNC.0) & USER_DATA_RESERVED == 0);

impl UserData {
    /// A request `store` waits for within the call.
    pub const SYNC: UserData = UserData(1 << 62);

    /// `blocks` below 2^28.
    #[inline(always)]
    pub fn new(tag: u32, kind: Kind, blocks: u64) -> UserData {
        debug_assert!(blocks <= BLOCKS_MASK, "{blocks} blocks do not fit");
        UserData(tag as u64 | (kind as u64) << KIND_SHIFT | blocks << BLOCKS_SHIFT)
    }

    /// A completion's `user_data`.
    #[inline(always)]
    pub fn from_raw(u: u64) -> UserData {
        UserData(u)
    }

    /// What the bdev carries.
    #[inline(always)]
    pub const fn raw(self) -> u64 {
        self.0
    }

    #[inline(always)]
    pub fn tag(self) -> u32 {
        self.0 as u32
    }

    /// Of this kind.
    #[inline(always)]
    pub fn is(self, kind: Kind) -> bool {
        (self.0 >> KIND_SHIFT) & 3 == kind as u64
    }

    #[inline(always)]
    pub fn blocks(self) -> u64 {
        (self.0 >> BLOCKS_SHIFT) & BLOCKS_MASK
    }

    /// A staged piece's (not a synchronous request's).
    #[inline(always)]
    pub fn is_part(self) -> bool {
        self.is(Kind::Part) && self.0 & UserData::SYNC.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_apart() {
        for (tag, kind, blocks) in [
            (0, Kind::Read, 0),
            (u32::MAX, Kind::Part, BLOCKS_MASK),
            (KID | 7, Kind::Other, 0),
            (0x7FFF_FFFF, Kind::Write, 1 << 16),
        ] {
            let u = UserData::new(tag, kind, blocks);
            assert_eq!((u.tag(), u.blocks()), (tag, blocks));
            for k in [Kind::Read, Kind::Write, Kind::Other, Kind::Part] {
                assert_eq!(u.is(k), k == kind);
            }
            assert_eq!(u.is_part(), kind == Kind::Part);
            assert_eq!(UserData::from_raw(u.raw()), u);
            assert_eq!(u.raw() & (UserData::SYNC.0 | USER_DATA_RESERVED), 0);
        }
        let s = UserData::SYNC;
        assert_eq!((s.tag(), s.is(Kind::Read), s.blocks()), (0, true, 0));
        assert!(!UserData::from_raw(s.raw() | 3 << KIND_SHIFT).is_part());
    }
}
