//! Device counters: plain integers updated under the controller lock on the
//! I/O path, published to atomics at the end of each `step()` that changed
//! them, so `SoftDevice::stats()` never takes the lock and the hot path does
//! no atomic read-modify-write.
//!
//! The same counters feed the SMART / Health log (data units, host commands,
//! media errors, error log entries). They survive controller resets, like a
//! real device's lifetime counters.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    pub shadow_doorbell_enabled: bool,
}

/// Lock-protected working copy (plus a few SMART-only counters).
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub s: DeviceStats,
    pub media_errors: u64,
    pub dirty: bool,
}

/// Lock-free published copy.
#[derive(Debug, Default)]
pub(crate) struct PublishedStats {
    vals: [AtomicU64; 11],
    shadow: AtomicBool,
}

impl PublishedStats {
    pub fn publish(&self, c: &DeviceStats) {
        let v = [
            c.admin_commands,
            c.io_commands,
            c.reads,
            c.writes,
            c.bytes_read,
            c.bytes_written,
            c.errors,
            c.cq_full_waits,
            c.invalid_doorbell_writes,
            c.resets,
            c.faults_fired,
        ];
        for (a, v) in self.vals.iter().zip(v) {
            a.store(v, Ordering::Relaxed);
        }
        self.shadow
            .store(c.shadow_doorbell_enabled, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> DeviceStats {
        let g = |i: usize| self.vals[i].load(Ordering::Relaxed);
        DeviceStats {
            admin_commands: g(0),
            io_commands: g(1),
            reads: g(2),
            writes: g(3),
            bytes_read: g(4),
            bytes_written: g(5),
            errors: g(6),
            cq_full_waits: g(7),
            invalid_doorbell_writes: g(8),
            resets: g(9),
            faults_fired: g(10),
            shadow_doorbell_enabled: self.shadow.load(Ordering::Relaxed),
        }
    }
}
