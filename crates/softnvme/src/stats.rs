//! Device counters: plain integers updated under the controller lock on the
//! I/O path (no atomics); `SoftDevice::stats()` copies them under the lock,
//! with the reads and writes (and their bytes) of the controller model's
//! I/O queue, which are also what SMART / Health reports. They survive
//! controller resets, like a real device's lifetime counters.
/// A snapshot of the device counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub admin_commands: u64,
    pub io_commands: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Commands completed with a non-success status.
    pub errors: u64,
    /// Times a completion was ready but the CQ had no free slot per the
    /// host's head doorbell.
    pub cq_full_waits: u64,
    pub invalid_doorbell_writes: u64,
    /// Controller resets (CC.EN 1 -> 0).
    pub resets: u64,
    pub faults_fired: u64,
    /// Interrupts signalled on the vectors' eventfds (each adds 1 to the
    /// eventfd counter).
    pub interrupts: u64,
    pub shadow_doorbell_enabled: bool,
    /// Steps run (rounds of the controller's poll loop, idle ones
    /// included): over a run's seconds, how often it looks at the
    /// doorbells.
    pub steps: u64,
}

/// Lock-protected working copy (reads, writes and bytes are the I/O
/// queue's: see `SoftDevice::stats`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub s: DeviceStats,
}
