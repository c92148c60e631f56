//! The target: its subsystems, their namespaces, listeners and hosts,
//! checked against each other and the bdevs.
use std::net::SocketAddr;

use pollux_bdev::Bdev;
use pollux_controller::MAX_NAMESPACES;
use pollux_spec::fabrics::{check_nqn, DISCOVERY_NQN};

use super::auth::{AuthOptions, HostKeys, Keyring};
use super::error::ConfigError;
use super::transport::TransportOptions;

/// A namespace: a bdev by name, with an optional NSID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub bdev: String,
    pub nsid: Option<u32>,
}

/// One NVM subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Serial number (default: made from the NQN).
    pub serial: Option<String>,
    /// Model number (default "pollux").
    pub model: Option<String>,
    /// Any host may connect; else only `hosts`.
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// DH-HMAC-CHAP keys of hosts of `hosts` (by keyring name): such a
    /// host must authenticate before any other command.
    pub host_keys: Vec<HostKeys>,
    pub namespaces: Vec<NamespaceConfig>,
    /// Where it is reachable (port 0: any free port, for tests).
    pub listeners: Vec<SocketAddr>,
    /// SPDK's `max_namespaces` (0: no limit of its own), kept for the
    /// listings and `save_config`.
    pub max_namespaces: u32,
}

impl SubsystemConfig {
    pub fn new(nqn: &str) -> SubsystemConfig {
        SubsystemConfig {
            nqn: nqn.to_string(),
            serial: None,
            model: None,
            allow_any_host: true,
            hosts: Vec::new(),
            host_keys: Vec::new(),
            namespaces: Vec::new(),
            listeners: Vec::new(),
            max_namespaces: 0,
        }
    }
}

/// The whole target.
#[derive(Default)]
pub struct TargetConfig {
    pub transport: TransportOptions,
    pub subsystems: Vec<SubsystemConfig>,
    /// The bdevs namespaces name.
    pub bdevs: Vec<Bdev>,
    /// Warnings met while reading (also logged).
    pub warnings: Vec<String>,
    /// The TCP transport was created (`nvmf_create_transport`): listed by
    /// `Target::transports` even with no subsystem (a target with
    /// subsystems always has it).
    pub transport_created: bool,
    /// Listeners of the discovery subsystem alone (SPDK's
    /// `nvmf_subsystem_add_listener` of the discovery NQN); it is served
    /// on every subsystem's listener too.
    pub discovery_listeners: Vec<SocketAddr>,
    /// The DH-HMAC-CHAP keys hosts' entries name (SPDK's `keyring`
    /// subsystem).
    pub keyring: Keyring,
    /// The digests and DH groups DH-HMAC-CHAP offers (SPDK's
    /// `nvmf_set_config`).
    pub auth: AuthOptions,
}

impl Clone for TargetConfig {
    fn clone(&self) -> Self {
        TargetConfig {
            transport: self.transport.clone(),
            subsystems: self.subsystems.clone(),
            bdevs: self.bdevs.clone(),
            warnings: self.warnings.clone(),
            transport_created: self.transport_created,
            discovery_listeners: self.discovery_listeners.clone(),
            keyring: self.keyring.clone(),
            auth: self.auth,
        }
    }
}

impl std::fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetConfig")
            .field("transport", &self.transport)
            .field("subsystems", &self.subsystems)
            .field("keyring", &self.keyring)
            .field("auth", &self.auth)
            .field(
                "bdevs",
                &self.bdevs.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}
impl TargetConfig {
    /// Checks names, NQNs, namespaces and listeners against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.transport.validate()?;
        for (i, s) in self.subsystems.iter().enumerate() {
            let bad = |why: String| {
                Err(ConfigError::Subsystem {
                    nqn: s.nqn.clone(),
                    why,
                })
            };
            if let Err(e) = check_nqn(&s.nqn) {
                return bad(format!("invalid NQN: {e}"));
            }
            if s.nqn == DISCOVERY_NQN {
                return bad("the discovery NQN is the target's own discovery subsystem".into());
            }
            if self.subsystems[..i].iter().any(|o| o.nqn == s.nqn) {
                return bad("defined twice".into());
            }
            for h in &s.hosts {
                if let Err(e) = check_nqn(h) {
                    return bad(format!("host NQN {h:?}: {e}"));
                }
            }
            for k in &s.host_keys {
                if !s.hosts.contains(&k.host) {
                    return bad(format!(
                        "host {:?} has DH-HMAC-CHAP keys but is not among the subsystem's hosts",
                        k.host
                    ));
                }
                for name in std::iter::once(&k.key).chain(&k.ctrlr_key) {
                    if self.keyring.get(name).is_none() {
                        return bad(format!(
                            "host {:?}: no key '{name}' in the keyring (keyring_file_add_key)",
                            k.host
                        ));
                    }
                }
            }
            // A subsystem without listener is valid (SPDK's too): one
            // may be added live (`Target::add_listener`).
            let mut nsids: Vec<u32> = Vec::new();
            for (k, ns) in s.namespaces.iter().enumerate() {
                if !self.bdevs.iter().any(|b| b.name() == ns.bdev) {
                    return bad(format!("namespace bdev '{}' does not exist", ns.bdev));
                }
                nsids.push(ns.nsid.unwrap_or(k as u32 + 1));
            }
            // Gaps are fine: a live-made subsystem saved by save_config
            // may have any NSIDs.
            let mut sorted = nsids.clone();
            sorted.sort_unstable();
            for (k, &id) in sorted.iter().enumerate() {
                if id == 0 || id as usize > MAX_NAMESPACES {
                    return bad(format!("namespace ID {id}: must be 1..={MAX_NAMESPACES}"));
                }
                if k > 0 && sorted[k - 1] == id {
                    return bad(format!("namespace IDs {nsids:?}: NSID {id} twice"));
                }
            }
        }
        Ok(())
    }

    /// The namespaces of subsystem `s`: NSID and bdev, by NSID (owned).
    pub(crate) fn ns_bdevs(&self, s: &SubsystemConfig) -> Vec<(u32, Bdev)> {
        self.namespaces(s)
            .into_iter()
            .map(|(id, b)| (id, b.clone()))
            .collect()
    }

    /// The namespaces of subsystem `s`: NSID and bdev, by NSID.
    pub fn namespaces<'a>(&'a self, s: &SubsystemConfig) -> Vec<(u32, &'a Bdev)> {
        let mut v: Vec<(u32, &Bdev)> = s
            .namespaces
            .iter()
            .enumerate()
            .filter_map(|(k, ns)| {
                let b = self.bdevs.iter().find(|b| b.name() == ns.bdev)?;
                Some((ns.nsid.unwrap_or(k as u32 + 1), b))
            })
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }
}
