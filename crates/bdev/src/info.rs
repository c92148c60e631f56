//! What a block device is: its geometry, limits and capabilities.
use crate::error::{Error, Result};

/// Operations a backend supports beyond read and write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    pub flush: bool,
    pub write_zeroes: bool,
    pub unmap: bool,
    pub reset: bool,
    /// NVMe commands pass through (`Io::nvme_passthru`, checked).
    pub nvme_passthru: bool,
    /// Requests take any host memory, including memory the caller lends
    /// (`Io::readv_raw` / `writev_raw`). False: data buffers must be the
    /// bdev's own DMA memory from `Bdev::alloc_buf` (NVMe), so a caller
    /// with memory of its own stages it through such buffers.
    pub host_memory: bool,
}

/// A block device's description, fixed when it is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BdevInfo {
    /// Unique among the bdevs of a process (SPDK's `name`).
    pub name: String,
    /// RFC 4122 bytes; random unless given.
    pub uuid: [u8; 16],
    /// Logical block size in bytes (a power of two, at least 512).
    pub block_size: u32,
    /// Size in blocks.
    pub num_blocks: u64,
    /// Alignment data buffers must have, in bytes (a power of two; 1 =
    /// none beyond what the backend's transport needs).
    pub buf_align: u32,
    /// Most bytes one backend request carries; larger requests are split
    /// (by the layer or, for NVMe, by the queue pair). `u32::MAX`: no limit.
    pub max_transfer: u32,
    /// Kind of backend ("null", "ram", "uring", "nvme").
    pub backend: &'static str,
    pub caps: Caps,
}

impl BdevInfo {
    /// log2 of the block size.
    #[inline(always)]
    pub fn block_shift(&self) -> u32 {
        self.block_size.trailing_zeros()
    }

    pub fn size_bytes(&self) -> u64 {
        self.num_blocks << self.block_shift()
    }

    /// The UUID in its text form.
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.uuid)
    }
}

/// A UUID's text form (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// A random version-4 UUID (from the kernel's random source).
pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: getrandom writes at most u.len() bytes into the buffer.
    let n = unsafe { libc::getrandom(u.as_mut_ptr().cast(), u.len(), 0) };
    if n != u.len() as isize {
        // Fall back on the clock and pid: unique enough for a name.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        u = (t ^ ((std::process::id() as u128) << 64)).to_le_bytes();
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// Parses "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || s.len() != 36 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(u)
}

pub(crate) fn check_geometry(name: &str, block_size: u32, num_blocks: u64) -> Result<()> {
    let bad = |msg: String| {
        Err(Error::Invalid {
            name: name.to_string(),
            msg,
        })
    };
    if name.is_empty() {
        return bad("the name is empty".into());
    }
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return bad(format!(
            "block size {block_size} is not a power of two between 512 and 65536"
        ));
    }
    if num_blocks == 0 {
        return bad("it has no blocks".into());
    }
    if num_blocks.checked_mul(block_size as u64).is_none() {
        return bad(format!(
            "{num_blocks} blocks of {block_size} bytes overflow"
        ));
    }
    Ok(())
}
