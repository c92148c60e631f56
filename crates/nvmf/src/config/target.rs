//! The target: its subsystems, their namespaces, listeners and hosts,
//! checked against each other and the bdevs.
use std::net::SocketAddr;

use pollux_bdev::Bdev;
use pollux_controller::{NsIds, MAX_NAMESPACES};
use pollux_spec::fabrics::{check_nqn, DISCOVERY_NQN};
use pollux_spec::log::AnaState;

use super::auth::{AuthOptions, HostKeys, Keyring};
use super::error::ConfigError;
use super::transport::{SockImpl, TransportOptions};

/// A namespace: a bdev by name, with an optional NSID, identifiers
/// (SPDK's `uuid`, `nguid`, `eui64`; none: derived from the serial
/// number) and ANA group (SPDK's `anagrpid`; 0: its NSID).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceConfig {
    pub bdev: String,
    pub nsid: Option<u32>,
    pub ids: NsIds,
    pub anagrpid: u32,
}

/// Controller IDs a subsystem gives (SPDK's `min_cntlid`/`max_cntlid`).
pub const CNTLID_MIN: u16 = 1;
pub const CNTLID_MAX: u16 = 0xFFEF;

/// Parses `N` bytes written as hexadecimal digits, dashes allowed
/// anywhere (a UUID's `8-4-4-4-12` form, SPDK's NGUID and EUI-64).
pub fn parse_hex_id<const N: usize>(s: &str) -> Option<[u8; N]> {
    let digits: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// A UUID in its text form, `8-4-4-4-12` hexadecimal digits.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<usize> = s.split('-').map(str::len).collect();
    (groups == [8, 4, 4, 4, 12]).then(|| parse_hex_id(s))?
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
    /// SPDK's `ana_reporting`: Asymmetric Namespace Access reporting.
    pub ana_reporting: bool,
    /// SPDK's `min_cntlid`/`max_cntlid`: the controller IDs it gives
    /// (disjoint ranges let two targets serve one subsystem to a host).
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    /// ANA states of listeners other than optimized (SPDK's
    /// `nvmf_subsystem_add_listener` `ana_state`, or
    /// `nvmf_subsystem_listener_set_ana_state`): (listener, ANA group or
    /// None for all, state), applied in order.
    pub ana_states: Vec<(SocketAddr, Option<u32>, AnaState)>,
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
            ana_reporting: false,
            min_cntlid: CNTLID_MIN,
            max_cntlid: CNTLID_MAX,
            ana_states: Vec::new(),
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
    /// The socket implementations listeners asked for (SPDK's
    /// per-listener `sock_impl` of `nvmf_subsystem_add_listener`): (NQN,
    /// listener, implementation). One implementation serves the whole
    /// target, the transport's: [`TargetConfig::validate`] refuses
    /// another.
    pub listener_sock_impls: Vec<(String, SocketAddr, SockImpl)>,
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
            listener_sock_impls: self.listener_sock_impls.clone(),
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
    /// Checks names, NQNs, namespaces and listeners against each other,
    /// and that the listeners' `sock_impl` is the transport's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_read()?;
        self.check_listener_sock_impls()
    }

    /// [`TargetConfig::validate`] but for the listeners' `sock_impl`:
    /// what a reader checks, its caller may still set the transport's
    /// (`pollux target --sock-impl` after `-c`).
    pub(crate) fn validate_read(&self) -> Result<(), ConfigError> {
        self.validate_with(&|name| self.bdevs.iter().any(|b| b.name() == name))
    }

    /// Each listener's `sock_impl` (SPDK's per-listener key) is the
    /// transport's: one implementation serves the whole target.
    pub fn check_listener_sock_impls(&self) -> Result<(), ConfigError> {
        let transport = self.transport.sock_impl;
        match self
            .listener_sock_impls
            .iter()
            .find(|(_, _, s)| *s != transport)
        {
            None => Ok(()),
            Some((nqn, addr, s)) => Err(ConfigError::ListenerSockImpl {
                nqn: nqn.clone(),
                addr: *addr,
                asked: s.name(),
                transport: transport.name(),
            }),
        }
    }

    /// [`TargetConfig::validate`], a namespace's bdev checked by
    /// `has_bdev` (its name) instead of against `bdevs`.
    pub(crate) fn validate_with(&self, has_bdev: &dyn Fn(&str) -> bool) -> Result<(), ConfigError> {
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
            if let Err(why) = check_cntlid_range(s.min_cntlid, s.max_cntlid) {
                return bad(why);
            }
            for (l, _, _) in &s.ana_states {
                if !s.listeners.contains(l) {
                    return bad(format!("ANA state of {l}, which is not a listener of it"));
                }
            }
            // A subsystem without listener is valid (SPDK's too): one
            // may be added live (`Target::add_listener`).
            let mut nsids: Vec<u32> = Vec::new();
            for (k, ns) in s.namespaces.iter().enumerate() {
                if !has_bdev(&ns.bdev) {
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

    /// The namespaces of subsystem `s`: NSID, bdev, identifiers and ANA
    /// group, by NSID (owned).
    pub(crate) fn ns_specs(&self, s: &SubsystemConfig) -> Vec<(u32, Bdev, NsIds, u32)> {
        let mut v: Vec<_> = s
            .namespaces
            .iter()
            .enumerate()
            .filter_map(|(k, ns)| {
                let b = self.bdevs.iter().find(|b| b.name() == ns.bdev)?;
                Some((
                    ns.nsid.unwrap_or(k as u32 + 1),
                    b.clone(),
                    ns.ids,
                    ns.anagrpid,
                ))
            })
            .collect();
        v.sort_by_key(|n| n.0);
        v
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

/// A UUID's text form, `8-4-4-4-12` lower-case hexadecimal digits.
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Checks a controller ID range (SPDK's rule: 1 <= min <= max <= FFEFh).
pub fn check_cntlid_range(min: u16, max: u16) -> Result<(), String> {
    if min < CNTLID_MIN || max > CNTLID_MAX || min > max {
        return Err(format!(
            "invalid controller ID range {min}-{max}: min_cntlid {CNTLID_MIN}..=max_cntlid..={CNTLID_MAX}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids_and_uuids() {
        let u = "0123abcd-4567-89ab-cdef-0123456789ab";
        let b = parse_uuid(u).unwrap();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[15], 0xab);
        assert_eq!(uuid_string(&b), u);
        assert_eq!(parse_uuid("0123abcd456789abcdef0123456789ab"), None);
        assert_eq!(parse_uuid("0123abcd-4567-89ab-cdef-0123456789ax"), None);
        assert_eq!(
            parse_hex_id::<16>("0123abcd456789abcdef0123456789ab"),
            Some(b)
        );
        assert_eq!(
            parse_hex_id::<8>("00112233-44556677"),
            Some([0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77])
        );
        assert_eq!(parse_hex_id::<8>("0011"), None);
        assert!(check_cntlid_range(1, 0xFFEF).is_ok());
        assert!(check_cntlid_range(10, 9).is_err());
        assert!(check_cntlid_range(0, 9).is_err());
        assert!(check_cntlid_range(1, 0xFFF0)
            .unwrap_err()
            .contains("1-65520"));
    }
}
