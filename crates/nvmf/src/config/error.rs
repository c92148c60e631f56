//! Why a configuration was refused.
use pollux_bdev::params::ParamError;

/// Why a configuration was refused; every message names the culprit.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("JSON configuration: {0}")]
    Json(#[from] serde_json::Error),
    #[error("JSON configuration: {0}")]
    Shape(String),
    #[error(transparent)]
    Bdev(#[from] pollux_bdev::config::ConfigError),
    #[error("JSON configuration: method '{method}' (nvmf subsystem) is not supported; supported: nvmf_create_transport, nvmf_create_subsystem, nvmf_subsystem_add_ns, nvmf_subsystem_add_listener, nvmf_subsystem_add_host, nvmf_set_config, keyring_file_add_key")]
    UnknownMethod { method: String },
    /// A method's parameter is unknown, missing or ill-typed (read by
    /// the bdev configuration's reader, worded as its errors are).
    #[error("JSON configuration: {0}")]
    Param(#[from] ParamError),
    #[error("subsystem '{nqn}': {why}")]
    Subsystem { nqn: String, why: String },
    /// A DH-HMAC-CHAP key file refused (never its contents).
    #[error("key '{name}' ({path}): {why}")]
    Key {
        name: String,
        path: String,
        why: String,
    },
    /// A listener's `sock_impl` is not the transport's.
    #[error("nvmf_subsystem_add_listener {addr} of '{nqn}': parameter 'sock_impl' is '{asked}', but the transport's sock_impl is '{transport}': one socket implementation serves the whole target (nvmf_create_transport's sock_impl, or pollux target --sock-impl)")]
    ListenerSockImpl {
        nqn: String,
        addr: std::net::SocketAddr,
        asked: &'static str,
        transport: &'static str,
    },
    #[error("transport option {option} = {value}: {why}")]
    Transport {
        option: &'static str,
        value: u64,
        why: String,
    },
}
