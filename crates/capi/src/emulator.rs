//! The emulated controller (`trtype:soft`): one `pollux-softnvme` device
//! per controller, run by its own device thread (as the CLI's emulator
//! without `--inline`: a C program cannot step the device).
use std::sync::Arc;

use pollux_host::trid::{Backend, SoftTrid};
use pollux_host::{Emulator, EmulatorError};
use pollux_pcie::platform::Platform;
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

/// The device of one emulated controller and the thread running it.
/// Drop it after the controller: its orderly shutdown needs the thread.
#[derive(Default)]
pub struct Soft {
    made: Vec<Arc<SoftDevice>>,
    /// Last: dropped after the devices.
    thread: Option<DeviceThread>,
}

impl Emulator for Soft {
    fn platform(&mut self, t: &SoftTrid) -> Result<Box<dyn Platform>, EmulatorError> {
        let backend = match t.backend {
            Backend::Null => BackendConfig::Null,
            Backend::Ram => BackendConfig::Ram,
            Backend::File => BackendConfig::File {
                path: t.path.clone().ok_or("file backend needs path:")?,
            },
        };
        let bs = 1u64 << t.lba_shift;
        if !(t.backend == Backend::File && t.size == 0)
            && (t.size < bs || !t.size.is_multiple_of(bs))
        {
            return Err(
                format!("size:{} is not a whole number of {bs}-byte blocks", t.size).into(),
            );
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
            serial: format!("SOFT{:04}", self.made.len()),
            ..SoftConfig::default()
        };
        if let Some(m) = t.limits.mdts {
            cfg.mdts = m;
        }
        if let Some(q) = t.limits.mqes {
            cfg.mqes = q;
        }
        let dev = SoftDevice::new(cfg)?;
        if self.thread.is_none() {
            self.thread =
                Some(DeviceThread::spawn(None).map_err(|e| format!("device thread: {e}"))?);
        }
        // The device must run before bring-up can talk to it.
        if let Some(th) = &self.thread {
            th.attach(dev.clone());
        }
        self.made.push(dev.clone());
        Ok(Box::new(SoftPlatform::new(dev, SoftMode::Threaded)))
    }
}
