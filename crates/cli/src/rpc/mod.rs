//! JSON-RPC management of `pollux target` and `pollux bdevperf` (the
//! `pollux-rpc` server on `-r PATH`), with SPDK's method names, parameters
//! and result shapes, so SPDK's own client (`spdk-rpc -s PATH`, `rpc.py`)
//! drives them.
//!
//! What the methods act on is an [`App`]: the bdev [`Registry`], the NVMe
//! opener (for `bdev_nvme_attach_controller`), the runtime (for the
//! thread statistics) and the `save_config` parts of other subsystems.
//! `framework.rs` has the framework methods and `save_config`, `bdev.rs`
//! the bdev ones, `nvme.rs` the NVMe controller ones (`bdev_nvme_*`),
//! `nvmf.rs` the target's `nvmf_*` ones (the target adds them to the
//! [`Methods`] before starting the server).
mod app;
mod bdev;
mod framework;
mod nvme;
pub mod nvmf;
mod registry;

use std::path::{Path, PathBuf};

use clap::Args;
use pollux_rpc::{Limits, Methods, ServeError, Server};

pub use app::App;
pub use registry::{bdev_entries, claimer, registry_of, trid_entry};

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

/// The methods every app serves: the framework's and the bdev ones
/// (creation only if the app has an NVMe opener).
pub fn methods(app: &App) -> Methods {
    let mut m = Methods::new();
    framework::add(&mut m, app);
    bdev::add(&mut m, app);
    nvme::add(&mut m, app);
    m
}
