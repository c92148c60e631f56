//! JSON-RPC management of `pollux target` and `pollux bdevperf` (the
//! `pollux-rpc` server on `-r PATH`), with SPDK's method names, parameters
//! and result shapes, so SPDK's own client (`spdk-rpc -s PATH`, `rpc.py`)
//! drives them.
//!
//! What the methods act on is an [`App`]: the bdev [`Registry`], the NVMe
//! opener (for `bdev_nvme_attach_controller`), the runtime (for the
//! thread statistics) and the `save_config` parts of other subsystems.
//! `framework.rs` has the framework methods and `save_config`, `bdev.rs`
//! the bdev ones, `nvmf.rs` the target's `nvmf_*` ones; a caller adds its
//! own (the target's nvmf methods) to the [`Methods`] before starting the
//! server.
mod bdev;
mod framework;
pub mod nvmf;
mod registry;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use clap::Args;
use pollux_bdev::Registry;
use pollux_rpc::{Limits, Methods, RpcError, ServeError, Server};
use pollux_runtime::RuntimeHandle;
use serde_json::Value;

use crate::nvme_open::NvmeOpener;

pub use registry::{bdev_entries, registry_of, trid_entry};

/// Where `pollux target` and `pollux bdevperf` listen unless `-r` says
/// otherwise (SPDK's apps: `/var/tmp/spdk.sock`).
pub const DEFAULT_SOCKET: &str = "/var/tmp/pollux.sock";

#[derive(Args, Debug, Clone)]
pub struct RpcArgs {
    /// JSON-RPC socket (SPDK's -r): drive it with SPDK's client, `spdk-rpc
    /// -s PATH METHOD ...`. Give each app its own.
    #[arg(short = 'r', long = "rpc-socket", value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub rpc_socket: PathBuf,
}

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
    pub fn add_save_config(&self, name: &str, f: SaveFn) {
        lock(&self.save).push((name.to_string(), f));
    }

    /// The methods every app serves: the framework's and the bdev ones
    /// (creation only if `opener` is set).
    pub fn methods(&self) -> Methods {
        let mut m = Methods::new();
        framework::add(&mut m, self);
        bdev::add(&mut m, self);
        m
    }
}

/// Locks `m`; a panic elsewhere while holding it leaves plain data.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Refuses early a socket path that another live process answers on (or
/// that is not a socket), before the app does its slow start-up.
pub fn check_socket(path: &Path) -> Result<(), ServeError> {
    Server::check(path)
}

/// Starts the server on `args`' socket.
pub fn serve(args: &RpcArgs, methods: Methods) -> Result<Server, ServeError> {
    let s = Server::start(&args.rpc_socket, methods, Limits::default())?;
    tracing::info!(socket = %args.rpc_socket.display(), "JSON-RPC server listening");
    Ok(s)
}

/// -22 (EINVAL) with `msg`.
pub fn einval(msg: impl Into<String>) -> RpcError {
    RpcError::errno(libc::EINVAL, msg)
}
