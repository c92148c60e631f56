//! Options of a channel, read by every backend when it opens one.
use pollux_host::QpairOptions;

/// Options of one channel.
#[derive(Clone, Debug)]
pub struct ChannelOptions {
    /// Most requests outstanding at once (an NVMe channel's queue depth).
    pub depth: u32,
    /// Track latency per request (reads the clock twice per I/O).
    pub latency: bool,
    /// NVMe backend: queue pair options other than the depth (None: the
    /// bdev's defaults).
    pub nvme: Option<QpairOptions>,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            depth: 128,
            latency: false,
            nvme: None,
        }
    }
}
