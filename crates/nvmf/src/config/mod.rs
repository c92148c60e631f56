//! The target's configuration: transport options, subsystems (NQN,
//! serial, model, namespaces on bdevs, listeners, host allow list), and
//! reading it from SPDK's JSON configuration shape:
//!
//! ```json
//! {"subsystems": [
//!   {"subsystem": "bdev", "config": [
//!     {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 32768, "block_size": 512}}]},
//!   {"subsystem": "nvmf", "config": [
//!     {"method": "nvmf_create_transport", "params": {"trtype": "TCP", "in_capsule_data_size": 4096}},
//!     {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "serial_number": "SPDK001", "allow_any_host": false}},
//!     {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
//!     {"method": "nvmf_subsystem_add_host", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "host": "nqn.2014-08.org.nvmexpress:uuid:1"}},
//!     {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
//!       "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}}}]}
//! ]}
//! ```
//!
//! The `bdev` subsystem is read by `pollux_bdev::config` (its methods and
//! rules); its `bdev_nvme_attach_controller` entries are opened by the
//! caller's function ([`TargetConfig::from_json_with`];
//! [`TargetConfig::from_json`] has none and refuses them). In the `nvmf` subsystem:
//! - `nvmf_create_transport`: `trtype` TCP; SPDK's `max_queue_depth`,
//!   `max_io_qpairs_per_ctrlr` (or `max_qpairs_per_ctrlr`),
//!   `in_capsule_data_size`, `max_io_size`, `max_aq_depth`,
//!   `num_shared_buffers`, `io_unit_size`, `buf_cache_size`, `kas`;
//!   `dif_insert_or_strip` only false; SPDK's other tuning parameters
//!   (`sock_priority`, `abort_timeout_sec`, `ack_timeout`,
//!   `data_wr_pool_size`, `control_msg_num`, `c2h_success`, `zcopy`,
//!   `disable_command_passthru`, `tgt_name`) accepted and ignored.
//!   `sock_impl` (`posix` or `uring`, SPDK's names: the socket
//!   implementation of the target's threads). pollux-specific, which
//!   SPDK does not know (its reader ignores them), each a field of
//!   [`TransportOptions`]: `icreq_timeout_ms`, `connect_timeout_ms`,
//!   `auth_timeout_ms`, `data_timeout_ms`, `send_iov`,
//!   `max_connections`, `max_unbound_connections`,
//!   `admin_in_capsule_data_size`, `max_h2c_data`, `rx_buffer_size`,
//!   `busy_poll_us`, `incoming_cpu`, `epoll_idle`, `direct_receive`,
//!   `epoll_receive`, `send_buffer`, and
//!   io_uring's `uring_fixed_files`, `uring_rx_buffers`,
//!   `uring_rx_buffer_size`, `uring_zcopy_threshold`,
//!   `uring_registered_buffers`. `save_config`
//!   writes SPDK's keys always and pollux's own (and `kas`, `sock_impl`)
//!   only when not the default. `pollux target`'s transport flags
//!   (`--sock-impl`, `--no-epoll-idle`, ...) override the file's value
//!   when given; a live `nvmf_create_transport` applies its parameters
//!   over the options the target started with.
//! - `nvmf_create_subsystem` (`nqn`, `serial_number`, `model_number`,
//!   `allow_any_host`, `max_namespaces`, `ana_reporting`, `min_cntlid`,
//!   `max_cntlid`).
//! - `nvmf_subsystem_add_ns` (`nqn`, `namespace.bdev_name`,
//!   `namespace.nsid`, `namespace.{uuid,nguid,eui64,anagrpid}`).
//! - `nvmf_subsystem_add_listener` (`nqn`,
//!   `listen_address.{trtype,adrfam,traddr,trsvcid}`, `ana_state`; the
//!   discovery NQN or `discovery`: a listener of the discovery subsystem
//!   alone; SPDK's per-listener `sock_impl` taken when it names the
//!   transport's, refused by [`TargetConfig::validate`] naming both when
//!   not: one implementation serves the whole target),
//!   `nvmf_subsystem_listener_set_ana_state`.
//! - `nvmf_subsystem_add_host` (`nqn`, `host`, and DH-HMAC-CHAP keys by
//!   keyring name: `dhchap_key`, `dhchap_ctrlr_key`).
//! - `nvmf_set_config` (`dhchap_digests`, `dhchap_dhgroups`: what
//!   DH-HMAC-CHAP offers; pollux's own `dhchap_dh_threads`,
//!   `dhchap_dh_queue_per_host`, `dhchap_dh_queue_max`: its DH worker
//!   pool; its other parameters ignored with a warning).
//! - `nvmf_set_max_subsystems` and `nvmf_set_crdt` are ignored with a
//!   warning.
//!
//! The `keyring` subsystem (read before `nvmf`, wherever it stands):
//! `keyring_file_add_key` (`name`, `path`: a DHHC-1 secret in a file only
//! its owner may access, as SPDK's `keyring_file` takes it). Anything
//! else is refused naming the method and parameter.
//! Parameters are read by `pollux_bdev::params`, the reader of the bdev
//! subsystem's methods too, so both are refused in the same words
//! (`<method>: parameter 'namespace.nsid': expected ..., got ...`).
mod auth;
mod error;
mod json;
mod reload;
mod target;
mod transport;

pub use auth::{
    mask_to_names, names_to_mask, AuthOptions, HostKeys, KeyFile, Keyring, DHGROUPS, DIGESTS,
    MAX_DH_QUEUE, MAX_DH_THREADS,
};
pub use error::ConfigError;
pub use reload::{
    plan, ConfigFile, LiveChange, ReloadPlan, Running, RunningAna, RunningSubsystem, SubsystemPlan,
};
pub use target::{
    check_cntlid_range, parse_hex_id, parse_uuid, uuid_string, NamespaceConfig, SubsystemConfig,
    TargetConfig, CNTLID_MAX, CNTLID_MIN,
};
pub use transport::{
    SockImpl, TransportOptions, MAX_CONNECTIONS, MAX_H2C_DATA, MAX_HANDSHAKE_TIMEOUT,
    MAX_RX_BUFFER, MAX_SEND_IOV, QUEUE_DEPTHS, REGISTERED_BUFFERS, SEND_BUFFERS,
};
