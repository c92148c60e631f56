//! The emulated controller (`trtype:soft`) behind the host library: the
//! CLI's [`Emulator`], which builds a `pollux-softnvme` device from a
//! [`SoftTrid`] and hands the host library its platform. The one place
//! that knows the emulator's platform (`SoftPlatform`).
//!
//! Devices run on one pinned device thread, started with the first of
//! them, or are stepped inline by the caller (`pollux perf --inline`,
//! `pollux bdevperf --inline`). Drop the emulator after the controllers
//! made through it: their orderly shutdown needs the device thread.
use std::sync::Arc;

use pollux_host::trid::{Backend, SoftLimits, SoftTrid};
use pollux_host::{Emulator, EmulatorError};
use pollux_pcie::platform::Platform;
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

/// Emulated controllers of one run: see the module docs.
pub struct SoftEmulator {
    inline: bool,
    device_core: Option<usize>,
    made: Vec<Arc<SoftDevice>>,
    /// Last: dropped after the devices.
    thread: Option<DeviceThread>,
}

impl SoftEmulator {
    /// `inline`: the caller steps the devices; else they run on a device
    /// thread pinned to `device_core` (None: not pinned).
    pub fn new(inline: bool, device_core: Option<usize>) -> SoftEmulator {
        SoftEmulator {
            inline,
            device_core,
            made: Vec::new(),
            thread: None,
        }
    }

    /// Whether the caller steps the devices.
    pub fn inline(&self) -> bool {
        self.inline
    }

    /// The devices made so far, in order.
    pub fn devices(&self) -> &[Arc<SoftDevice>] {
        &self.made
    }

    /// Starts the device thread now (else the first device starts it), so
    /// that a thread that cannot start is reported before anything opens.
    pub fn start_thread(&mut self) -> std::io::Result<()> {
        if self.thread.is_none() && !self.inline {
            self.thread = Some(DeviceThread::spawn(self.device_core)?);
        }
        Ok(())
    }
}

/// The emulator's configuration for `t`; `index` numbers the serial.
fn soft_config(t: &SoftTrid, index: usize) -> Result<SoftConfig, EmulatorError> {
    let backend = match t.backend {
        Backend::Null => BackendConfig::Null,
        Backend::Ram => BackendConfig::Ram,
        Backend::File => BackendConfig::File {
            path: t.path.clone().ok_or("file backend needs path:")?,
        },
    };
    // size:0 of a file backend: the file's size.
    if !(t.backend == Backend::File && t.size == 0) {
        crate::common::opts::size_in_blocks(t.size, 1 << t.lba_shift, "lbads:")
            .map_err(|e| format!("size:{}: {e}", t.size))?;
    }
    let ns = (0..t.namespaces)
        .map(|_| NamespaceConfig {
            backend: backend.clone(),
            lba_shift: t.lba_shift,
            size_bytes: t.size,
        })
        .collect();
    let mut cfg = SoftConfig {
        namespaces: ns,
        serial: format!("SOFT{index:04}"),
        ..SoftConfig::default()
    };
    apply_limits(&t.limits, &mut cfg);
    Ok(cfg)
}

impl Emulator for SoftEmulator {
    fn platform(&mut self, t: &SoftTrid) -> Result<Box<dyn Platform>, EmulatorError> {
        let dev = SoftDevice::new(soft_config(t, self.made.len())?)?;
        let mode = if self.inline {
            SoftMode::Inline
        } else {
            self.start_thread()
                .map_err(|e| format!("device thread: {e}"))?;
            // The device must run before bring-up can talk to it.
            if let Some(th) = &self.thread {
                th.attach(dev.clone());
            }
            SoftMode::Threaded
        };
        self.made.push(dev.clone());
        Ok(Box::new(SoftPlatform::new(dev, mode)))
    }
}

/// Writes the limits of a `trtype:soft` transport ID that were given into
/// `cfg` (the others keep the emulator's defaults).
pub fn apply_limits(l: &SoftLimits, cfg: &mut SoftConfig) {
    if let Some(m) = l.mdts {
        cfg.mdts = m;
    }
    if let Some(q) = l.mqes {
        cfg.mqes = q;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_host::trid::{parse, SoftTrid, Trid, MAX_MDTS};

    fn soft(s: &str) -> SoftTrid {
        match parse(s) {
            Ok(Trid::Soft(t)) => t,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn soft_limits_map_to_the_controller() {
        let l = soft("trtype:soft backend:ram size:1MiB mdts:1 mqes:3").limits;
        let mut cfg = SoftConfig::default();
        apply_limits(&l, &mut cfg);
        assert_eq!(cfg.mdts, 1);
        assert_eq!(4096usize << cfg.mdts, 8 << 10, "mdts:1 is 8 KiB");
        assert_eq!(cfg.mqes, 3);
        let dev = pollux_softnvme::SoftDevice::new(cfg).expect("valid config");
        let (bar, _) = dev.bar0();
        // SAFETY: BAR0 is page aligned and valid while `dev` lives; CAP is
        // at offset 0, accessed as an aligned atomic.
        let cap = unsafe { &*bar.as_ptr().cast::<std::sync::atomic::AtomicU32>() }
            .load(std::sync::atomic::Ordering::Acquire);
        let cap = pollux_spec::regs::Cap(cap as u64);
        assert_eq!(cap.mqes(), 3, "mqes:3 gives 4-entry queues");

        // Unset limits keep the defaults.
        let l = soft("trtype:soft").limits;
        let mut cfg = SoftConfig::default();
        apply_limits(&l, &mut cfg);
        assert_eq!(cfg.mdts, SoftConfig::default().mdts);
        assert_eq!(cfg.mqes, SoftConfig::default().mqes);

        // The extremes the parser accepts are valid controller configs, and
        // the parser's bound is the emulator's.
        assert_eq!(MAX_MDTS, pollux_softnvme::MAX_MDTS);
        for s in [
            "trtype:soft mdts:0 mqes:1",
            "trtype:soft MDTS:16 MQES:65535",
        ] {
            let mut cfg = SoftConfig::default();
            apply_limits(&soft(s).limits, &mut cfg);
            pollux_softnvme::SoftDevice::new(cfg).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }
}
