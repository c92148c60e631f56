//! pollux-nvmf — an NVMe over Fabrics target (NVMe over Fabrics of the
//! NVMe 2.0 base specification) with the NVMe/TCP transport (NVMe/TCP
//! Transport 1.0), on pollux's thread-per-core runtime.
//!
//! Laid out as SPDK's `lib/nvmf`: a transport-independent core, and the
//! transports beside it (TCP today; RDMA or vfio-user would be siblings
//! of `tcp`, reusing the rest).
//!
//! The core:
//! - **Target** (`tgt`, [`Target`]): builds the subsystems from the
//!   configuration, starts the runtime threads and the transport.
//! - **Subsystems and controllers** (`shared`): the subsystems (behind a
//!   read-write lock, changed live), the table of live controllers
//!   (associations) and where each queue's connection lives and which
//!   listener it came through; the locks are taken at Connect,
//!   Disconnect, close, Keep Alive expiry and live changes, never on the
//!   I/O path.
//! - **Live configuration** (`live`): `&Target` methods, as SPDK's
//!   `nvmf_*` JSON-RPC methods: the TCP transport
//!   ([`Target::create_transport`]), subsystems, hosts and listeners
//!   added and removed while hosts are connected (closing only the
//!   queues a change takes away), the listings in SPDK's shapes and
//!   `save_config`'s nvmf entries ([`Target::save_config_nvmf`]).
//! - **Queue pairs** (`qpair`): a queue's command slots and their data
//!   buffers, SQ head, the controller it is bound to, Keep Alive, and
//!   `QueueTransport`, what the core asks of a transport connection
//!   (send a response or data, get a write's data, close). The command
//!   handling is generic over it: monomorphised per transport, no `dyn`
//!   call per I/O.
//! - **Fabrics** (`fabrics`): Connect (admin and I/O queues, dynamic
//!   controller IDs, host allow lists, SQSIZE/QID checks), Property
//!   Get/Set (CAP, VS, CC, CSTS), Disconnect.
//! - **Authentication** (`auth`): DH-HMAC-CHAP (`pollux-auth`'s
//!   `CtrlAuth`) over Authentication Send/Receive for hosts given a key
//!   (a keyring of DHHC-1 key files, SPDK's `keyring_file_add_key`, and
//!   the hosts' `dhchap_key`/`dhchap_ctrlr_key`); until a queue's host
//!   has authenticated, its other commands get Authentication Required.
//! - **Admin and I/O commands** (`admin`, `io`) against the controller
//!   model (`pollux-controller`, reached through `model` only): SGL
//!   checks (in-capsule offset 01h, transport 5Ah), data buffers, the I/O
//!   queue's submissions and completions.
//! - **Discovery** (`discovery`): the well-known discovery NQN, Get Log
//!   Page 70h listing the subsystems the connecting host may reach.
//! - **Live namespaces** (`live_ns`): [`Target::add_namespace`] and
//!   [`Target::remove_namespace`] while hosts are connected, with the
//!   Namespace Attribute Changed event to each controller.
//! - **Configuration** ([`TargetConfig`]): SPDK's JSON shape, or built in
//!   code.
//! - **NVMe namespaces**: bdevs of NVMe namespaces on any host transport
//!   (PCIe, the emulated controller, TCP), side by side; an NVMe
//!   namespace's data is staged through its controller's DMA memory
//!   (`pollux-controller`'s `store`), synchronously.
//!
//! Transport resources: data buffers (`buf`) from a pool (`pool`: SPDK's
//! `num_shared_buffers`, cached per thread) each transport creates;
//! commands whose buffer is not there wait for it.
//!
//! The NVMe/TCP transport (`tcp`): listeners and accept, each thread's
//! connections, ICReq/ICResp, command capsules, R2T + H2CData, C2HData,
//! digests, C2HTermReq, handshake and data timeouts (see its module).
//! Each connection is owned by one runtime thread; nothing is locked on
//! the I/O path. Techniques, each switchable in [`TransportOptions`]:
//! batched sends (one `sendmsg` per poll), large receives straight into
//! command buffers, `SO_INCOMING_CPU` placement, epoll idle sleep.
//!
//! `testing` (hidden) is what `tests/fuzz/` needs to drive a connection
//! over memory; it is not part of the API.
mod admin;
mod auth;
mod buf;
pub mod config;
mod discovery;
mod fabrics;
mod io;
mod live;
mod live_ana;
mod live_ns;
mod live_reload;
mod model;
mod pool;
mod qpair;
mod shared;
mod tcp;
#[doc(hidden)]
pub mod testing;
mod tgt;

pub use config::{
    check_cntlid_range, parse_hex_id, parse_uuid, uuid_string, ConfigError, NamespaceConfig,
    SockImpl, SubsystemConfig, TargetConfig, TransportOptions, CNTLID_MAX, CNTLID_MIN,
    MAX_SEND_IOV,
};
pub use config::{
    mask_to_names, names_to_mask, AuthOptions, HostKeys, KeyFile, Keyring, DHGROUPS, DIGESTS,
    MAX_DH_QUEUE, MAX_DH_THREADS,
};
pub use live::{listen_address, LiveError, SubsystemOptions};
pub use live_reload::ReloadOutcome;
pub use model::ModelError;
/// The parameter errors of [`ConfigError::Param`] (the bdev configuration's reader).
pub use pollux_bdev::params::ParamError;
pub use pollux_controller::NsIds;
pub use pollux_runtime::RuntimeOptions;
pub use pollux_spec::log::AnaState;
pub use tgt::{Target, TargetError};
