//! What a namespace or partition holds: ZFS labels and btrfs superblocks.
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// What a namespace or partition holds, as far as `pollux setup` cares.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Content {
    /// A ZFS vdev label (what blkid reports as TYPE zfs_member).
    pub zfs: bool,
    /// A btrfs superblock.
    pub btrfs: Option<BtrfsMember>,
}

/// The btrfs a device belongs to (from its primary superblock).
#[derive(Debug, PartialEq, Eq)]
pub struct BtrfsMember {
    /// File system UUID as /sys/fs/btrfs names it.
    pub fsid: String,
    /// Devices the file system spans.
    pub num_devices: u64,
}

/// ZFS: four 256 KiB vdev labels, two at the start of the device, two at
/// its end (size rounded down to 256 KiB); each ends in a 128 KiB ring of
/// uberblocks, at least 1 KiB apart, whose first word is the magic in the
/// writer's byte order.
const ZFS_LABEL: u64 = 256 * 1024;
const ZFS_RING: u64 = 128 * 1024;
const ZFS_UB_STEP: usize = 1024;
const ZFS_UB_MAGIC: u64 = 0x00ba_b10c;
/// Uberblocks needed for a match, over all labels (as blkid: one stray
/// magic word is not a pool).
const ZFS_UB_WANT: usize = 4;
/// btrfs: the primary superblock at 64 KiB; fsid at 0x20, magic at 0x40,
/// num_devices at 0x88.
const BTRFS_SUPER: u64 = 64 * 1024;
const BTRFS_MAGIC: &[u8; 8] = b"_BHRfS_M";

/// Size of the btrfs superblock.
const BTRFS_SUPER_SIZE: u64 = 4096;

impl Content {
    /// Reads the ZFS labels and the btrfs superblock of `path` (a block
    /// device, or an image file in tests), ignoring those that overlap a
    /// `covered` byte range `[start, end)` (a whole disk's partitions, whose
    /// content is the partitions').
    pub fn probe(path: &Path, covered: &[(u64, u64)]) -> std::io::Result<Content> {
        use std::io::{Seek, SeekFrom};
        let mut f = fs::File::open(path)?;
        // Block devices report length 0 in their metadata; seek to the end.
        let size = f.seek(SeekFrom::End(0))?;
        let free = |off: u64, len: u64| !covered.iter().any(|&(s, e)| off < e && s < off + len);
        Ok(Content {
            zfs: zfs_uberblocks(&f, size, &free)? >= ZFS_UB_WANT,
            btrfs: if free(BTRFS_SUPER, BTRFS_SUPER_SIZE) {
                btrfs_member(&f)?
            } else {
                None
            },
        })
    }
}

/// Reads up to `buf.len()` bytes at `off`; returns how many (short at the
/// end of the device).
fn read_upto(f: &fs::File, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Uberblock magics in the ZFS label rings of a device of `size` bytes,
/// in the labels for which `free(offset, length)` holds.
fn zfs_uberblocks(
    f: &fs::File,
    size: u64,
    free: &dyn Fn(u64, u64) -> bool,
) -> std::io::Result<usize> {
    let end = size - size % ZFS_LABEL;
    let mut labels = vec![0, ZFS_LABEL];
    if end >= 2 * ZFS_LABEL {
        labels.extend([end - 2 * ZFS_LABEL, end - ZFS_LABEL]);
    }
    labels.retain(|&l| l + ZFS_LABEL <= size && free(l, ZFS_LABEL));
    labels.sort_unstable();
    labels.dedup();
    let mut ring = vec![0u8; ZFS_RING as usize];
    let mut found = 0;
    for l in labels {
        let n = read_upto(f, l + ZFS_RING, &mut ring)?;
        found += ring[..n]
            .chunks_exact(ZFS_UB_STEP)
            .filter(|ub| {
                let w = [ub[0], ub[1], ub[2], ub[3], ub[4], ub[5], ub[6], ub[7]];
                u64::from_le_bytes(w) == ZFS_UB_MAGIC || u64::from_be_bytes(w) == ZFS_UB_MAGIC
            })
            .count();
    }
    Ok(found)
}

/// The btrfs superblock's fsid and device count, if there is one.
fn btrfs_member(f: &fs::File) -> std::io::Result<Option<BtrfsMember>> {
    let mut sb = [0u8; 0x90];
    if read_upto(f, BTRFS_SUPER, &mut sb)? < sb.len() || &sb[0x40..0x48] != BTRFS_MAGIC {
        return Ok(None);
    }
    let mut fsid = String::new();
    for (i, b) in sb[0x20..0x30].iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            fsid.push('-');
        }
        let _ = write!(fsid, "{b:02x}");
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&sb[0x88..0x90]);
    Ok(Some(BtrfsMember {
        fsid,
        num_devices: u64::from_le_bytes(n),
    }))
}
