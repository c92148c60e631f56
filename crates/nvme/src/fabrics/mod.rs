//! The fabrics core of the host: what every NVMe over Fabrics transport
//! shares, whatever carries its capsules. The admin connection of an
//! association (`link`): fabrics Connect on every queue, the controller's
//! registers as Property Get/Set, the core's admin commands, Keep Alive,
//! and the reconnect policy (`ctrl_loss_tmo`, `reconnect_delay`,
//! `fast_io_fail_tmo`).
//!
//! A transport supplies the wire through two traits (`wire`): a
//! [`Fabric`] opens a connection for a queue, a [`Connection`] exchanges
//! capsules on it. NVMe/TCP (`pollux-tcp`) is one; the core imports no
//! transport.
mod link;
mod options;
mod wire;

pub use link::{path_error, AdminLink, ADMIN_MAX_DATA, ADMIN_SLOTS, ADMIN_SQ_ENTRIES};
pub use options::FabricsOptions;
pub use wire::{CapsuleData, Connection, Fabric};
