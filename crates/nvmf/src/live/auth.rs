//! JSON-RPC's DH-HMAC-CHAP parts, live: the keyring (SPDK's
//! `keyring_file_add_key`, `keyring_file_remove_key`,
//! `keyring_get_keys`) and a host's keys (`nvmf_subsystem_add_host`'s
//! `dhchap_key`, `dhchap_ctrlr_key`). A host's new keys apply to its next
//! Connect (queues connected stay).
use std::path::Path;

use pollux_spec::fabrics::check_nqn;
use serde_json::{json, Value};

use super::LiveError;
use crate::auth::state::HostSecrets;
use crate::config::{mask_to_names, KeyFile, DHGROUPS, DIGESTS};
use crate::tgt::Target;

impl Target {
    /// Adds key `name` read from `path` to the keyring (SPDK's
    /// `keyring_file_add_key`: an absolute path, a file only its owner,
    /// this process's user, may access, holding a DHHC-1 secret).
    pub fn add_key(&self, name: &str, path: &Path) -> Result<(), LiveError> {
        let mut live = self.live();
        let key = KeyFile::load(name, path).map_err(|e| LiveError::Key(e.to_string()))?;
        live.keyring
            .add(key)
            .map_err(|e| LiveError::Key(e.to_string()))?;
        tracing::info!(name, path = %path.display(), "key added to the keyring");
        Ok(())
    }

    /// Removes key `name` from the keyring (SPDK's
    /// `keyring_file_remove_key`); hosts given it keep it until removed.
    pub fn remove_key(&self, name: &str) -> Result<(), LiveError> {
        if !self.live().keyring.remove(name) {
            return Err(LiveError::NoKey { name: name.into() });
        }
        tracing::info!(name, "key removed from the keyring");
        Ok(())
    }

    /// The keyring as SPDK's `keyring_get_keys` lists it (names and
    /// paths, never the keys).
    pub fn keys(&self) -> Vec<Value> {
        self.live()
            .keyring
            .keys
            .iter()
            .map(|k| {
                json!({"name": k.name, "module": "keyring_file", "removed": false,
                        "probed": true, "refcnt": 1, "path": k.path.display().to_string()})
            })
            .collect()
    }

    /// `save_config`'s keyring entries.
    pub fn save_config_keyring(&self) -> Vec<Value> {
        self.live()
            .keyring
            .keys
            .iter()
            .map(|k| json!({"method": "keyring_file_add_key", "params": {"name": k.name, "path": k.path.display().to_string()}}))
            .collect()
    }

    /// Allows `host` to connect to `nqn`, authenticating with keyring key
    /// `key` (and, bidirectionally, the controller with `ctrlr_key`)
    /// (SPDK's `nvmf_subsystem_add_host` with `dhchap_key` and
    /// `dhchap_ctrlr_key`). A host listed already gets these keys (none:
    /// it no longer authenticates).
    pub fn add_host_with_keys(
        &self,
        nqn: &str,
        host: &str,
        key: Option<&str>,
        ctrlr_key: Option<&str>,
    ) -> Result<(), LiveError> {
        let live = self.live();
        let invalid = |why: String| LiveError::InvalidHost {
            nqn: nqn.into(),
            host: host.into(),
            why,
        };
        check_nqn(host).map_err(|e| invalid(format!("invalid NQN: {e}")))?;
        let find = |n: &str, param: &str| {
            live.keyring.get(n).cloned().ok_or_else(|| {
                invalid(format!(
                    "{param}: no key '{n}' in the keyring (keyring_file_add_key first)"
                ))
            })
        };
        let secrets = match (key, ctrlr_key) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(invalid(
                    "dhchap_ctrlr_key: a controller key needs a host key (dhchap_key)".into(),
                ))
            }
            (Some(k), c) => Some(HostSecrets {
                host: host.to_string(),
                key: find(k, "dhchap_key")?,
                ctrlr_key: c.map(|c| find(c, "dhchap_ctrlr_key")).transpose()?,
            }),
        };
        Self::change(&self.shared(), nqn, |e| {
            if !e.hosts.iter().any(|h| h == host) {
                e.hosts.push(host.into());
            }
            e.host_keys.retain(|k| k.host != host);
            e.host_keys.extend(secrets);
            Ok(())
        })?;
        tracing::info!(
            nqn,
            host,
            dhchap_key = key,
            dhchap_ctrlr_key = ctrlr_key,
            "host added to subsystem"
        );
        Ok(())
    }

    /// `save_config`'s `nvmf_set_config` (SPDK writes one always): the
    /// digests and DH groups offered.
    pub(crate) fn save_config_set_config(&self) -> Value {
        let a = self.shared().auth;
        let mut j = json!({"method": "nvmf_set_config", "params": {
            "dhchap_digests": mask_to_names(&DIGESTS, a.digests),
            "dhchap_dhgroups": mask_to_names(&DHGROUPS, a.dhgroups),
        }});
        // pollux's own: written only when not the default (SPDK's reader
        // refuses unknown parameters).
        let d = crate::config::AuthOptions::default();
        for (k, v, dv) in [
            ("dhchap_dh_threads", a.dh_threads, d.dh_threads),
            (
                "dhchap_dh_queue_per_host",
                a.dh_queue_per_host,
                d.dh_queue_per_host,
            ),
            ("dhchap_dh_queue_max", a.dh_queue_max, d.dh_queue_max),
        ] {
            if v != dv {
                j["params"][k] = v.into();
            }
        }
        j
    }
}
