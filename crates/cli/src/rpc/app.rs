//! What the methods act on ([`App`]), shared by `bdev.rs`,
//! `framework.rs` and the callers.
use std::sync::{Arc, Mutex, OnceLock};

use pollux_bdev::Registry;
use pollux_rpc::RpcError;
use pollux_runtime::RuntimeHandle;
use serde_json::Value;

use crate::nvme_open::NvmeOpener;

/// A source of the runtime the app's threads run on (for
/// `thread_get_stats`, `framework_get_reactors`).
pub trait AsRuntime: Send + Sync {
    fn runtime(&self) -> &RuntimeHandle;
}

impl AsRuntime for RuntimeHandle {
    fn runtime(&self) -> &RuntimeHandle {
        self
    }
}

impl AsRuntime for pollux_nvmf::Target {
    fn runtime(&self) -> &RuntimeHandle {
        pollux_nvmf::Target::runtime(self)
    }
}

/// A subsystem's part of `save_config` (its `config` array).
pub type SaveFn = Box<dyn Fn() -> Vec<Value> + Send + Sync>;

/// What the methods act on; cheap to clone (all shared).
#[derive(Clone)]
pub struct App {
    /// The app's bdevs.
    pub registry: Arc<Registry>,
    /// Opens NVMe controllers for `bdev_nvme_attach_controller`; None: the
    /// app creates no bdevs by RPC (bdevperf).
    pub opener: Option<Arc<Mutex<NvmeOpener>>>,
    /// The runtime, once it runs.
    pub runtime: Arc<OnceLock<Arc<dyn AsRuntime>>>,
    /// `save_config`'s other subsystems (after `bdev`), by name, in order.
    pub save: Arc<Mutex<Vec<(String, SaveFn)>>>,
}

impl App {
    pub fn new(registry: Arc<Registry>, opener: Option<Arc<Mutex<NvmeOpener>>>) -> App {
        App {
            registry,
            opener,
            runtime: Arc::new(OnceLock::new()),
            save: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Sets the runtime (once; later calls are ignored).
    pub fn set_runtime(&self, rt: Arc<dyn AsRuntime>) {
        let _ = self.runtime.set(rt);
    }

    /// Adds subsystem `name`'s part of `save_config` (e.g. "nvmf").
    #[allow(dead_code)] // (for the target's nvmf methods)
    pub fn add_save_config(&self, name: &str, f: SaveFn) {
        lock(&self.save).push((name.to_string(), f));
    }
}

/// Locks `m`; a panic elsewhere while holding it leaves plain data.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// -22 (EINVAL) with `msg`.
pub fn einval(msg: impl Into<String>) -> RpcError {
    RpcError::errno(libc::EINVAL, msg)
}
