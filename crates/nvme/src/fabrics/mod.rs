//! The fabrics core of the host: what every NVMe over Fabrics transport
//! shares, whatever carries its capsules.
//!
//! - `link`: the admin connection of an association, the control path:
//!   the core's admin commands, the controller's registers, resets as new
//!   associations, a lost association reconnected.
//! - `connect`: fabrics Connect on every queue (and asking the controller
//!   to disable SQ flow control on I/O queues).
//! - `auth`: in-band authentication (DH-HMAC-CHAP) after each Connect.
//! - `property`: registers as Property Get/Set.
//! - `keepalive`: the Keep Alive thread.
//! - `reconnect`: the reconnect policy (`ctrl_loss_tmo`, `reconnect_delay`,
//!   `fast_io_fail_tmo`) as a schedule.
//! - `held`: I/O held across a reconnect (retried, up to a limit).
//! - `discovery`: reading a Discovery Log Page.
//! - `refused`: a refused Connect, told as what went wrong and what to do.
//!
//! A transport supplies the wire through two traits (`wire`): a
//! [`Fabric`] opens a connection for a queue, a [`Connection`] exchanges
//! capsules on it. NVMe/TCP (`pollux-tcp`) is one; the core imports no
//! transport.
mod auth;
pub(crate) mod auth_failed;
mod connect;
mod discovery;
mod held;
mod keepalive;
mod link;
mod options;
mod property;
mod reconnect;
pub(crate) mod refused;
mod wire;

pub use auth_failed::{AuthFailed, AuthFailure};
pub use discovery::discover;
pub use held::{aborted_status, path_error, retry, MAX_RETRIES};
pub use keepalive::KeepAlive;
pub use link::{AdminLink, ADMIN_MAX_DATA, ADMIN_SLOTS, ADMIN_SQ_ENTRIES};
pub use options::{AuthOptions, FabricsOptions};
pub use refused::ConnectRefused;
pub use wire::{CapsuleData, Connection, Fabric};
