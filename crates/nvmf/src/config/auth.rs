//! DH-HMAC-CHAP in-band authentication's configuration: the keyring
//! (SPDK's `keyring_file`: named DHHC-1 key files), a host's keys by
//! name, and the digests and DH groups the target offers (SPDK's
//! `nvmf_set_config` `dhchap_digests` / `dhchap_dhgroups`).
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pollux_auth::DhchapKey;

use super::error::ConfigError;

/// A key of the keyring: its name, its file, and the secret read from
/// it when it was added (never printed: `Debug` shows the name and path).
#[derive(Clone)]
pub struct KeyFile {
    pub name: String,
    pub path: PathBuf,
    pub(crate) secret: Arc<DhchapKey>,
}

impl std::fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFile")
            .field("name", &self.name)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PartialEq for KeyFile {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.path == o.path
    }
}

impl KeyFile {
    /// Reads key `name` from `path` as SPDK's `keyring_file` accepts it:
    /// an absolute path to a file of the current user that neither its
    /// group nor others may read or write (mode `0600` or stricter),
    /// holding a DHHC-1 secret (as `nvme gen-dhchap-key` writes it).
    pub fn load(name: &str, path: &Path) -> Result<KeyFile, ConfigError> {
        let bad = |why: String| ConfigError::Key {
            name: name.to_string(),
            path: path.display().to_string(),
            why,
        };
        if name.is_empty() {
            return Err(bad("an empty key name".into()));
        }
        if !path.is_absolute() {
            return Err(bad(
                "not an absolute path (the keyring takes only those)".into()
            ));
        }
        let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot stat it: {e}")))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "mode {mode:04o}: its group or others may access it (chmod 0600)"
            )));
        }
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        if meta.uid() != uid {
            return Err(bad(format!(
                "owned by uid {}, not by this process's uid {uid}",
                meta.uid()
            )));
        }
        let secret = match DhchapKey::from_file(path) {
            Ok(k) => k,
            Err(pollux_auth::SecretError::Io { source, .. }) => {
                return Err(bad(format!("cannot read it: {source}")))
            }
            Err(e) => return Err(bad(format!("not a DHHC-1 secret: {e}"))),
        };
        Ok(KeyFile {
            name: name.to_string(),
            path: path.to_path_buf(),
            secret: Arc::new(secret),
        })
    }
}

/// The keyring: keys by name (SPDK's `keyring_file_add_key`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Keyring {
    pub keys: Vec<KeyFile>,
}

impl Keyring {
    /// Adds `key`; a name taken already is refused.
    pub fn add(&mut self, key: KeyFile) -> Result<(), ConfigError> {
        if self.get(&key.name).is_some() {
            return Err(ConfigError::Key {
                name: key.name.clone(),
                path: key.path.display().to_string(),
                why: "a key of this name is in the keyring already".into(),
            });
        }
        self.keys.push(key);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&KeyFile> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// Removes key `name`; false if there was none.
    pub fn remove(&mut self, name: &str) -> bool {
        let n = self.keys.len();
        self.keys.retain(|k| k.name != name);
        self.keys.len() != n
    }
}

/// A host's DH-HMAC-CHAP keys, by keyring name: `key` authenticates the
/// host, `ctrlr_key` (bidirectional authentication) the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostKeys {
    pub host: String,
    pub key: String,
    pub ctrlr_key: Option<String>,
}

/// The hash functions of DH-HMAC-CHAP (SPDK's names; bit `id` of a
/// mask, the spec's identifiers 1..=3).
pub const DIGESTS: [(&str, u8); 3] = [("sha256", 1), ("sha384", 2), ("sha512", 3)];

/// The DH groups of DH-HMAC-CHAP (SPDK's names; the spec's identifiers
/// 0..=5).
pub const DHGROUPS: [(&str, u8); 6] = [
    ("null", 0),
    ("ffdhe2048", 1),
    ("ffdhe3072", 2),
    ("ffdhe4096", 3),
    ("ffdhe6144", 4),
    ("ffdhe8192", 5),
];

/// What the target offers in DH-HMAC-CHAP: masks of identifiers (bit
/// `id`) of [`DIGESTS`] and [`DHGROUPS`]; all of them by default. And
/// where its Diffie-Hellman work runs: on `dh_threads` worker threads
/// (not the reactor threads), with at most `dh_queue_per_host` jobs of
/// one host (peer address and host NQN) and `dh_queue_max` in all
/// waiting or running; an exchange beyond them fails (AUTH_Failure1).
/// (pollux's own, `nvmf_set_config` `dhchap_dh_threads`,
/// `dhchap_dh_queue_per_host`, `dhchap_dh_queue_max`; SPDK has none.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthOptions {
    pub digests: u8,
    pub dhgroups: u8,
    pub dh_threads: u32,
    pub dh_queue_per_host: u32,
    pub dh_queue_max: u32,
}

/// Most DH worker threads.
pub const MAX_DH_THREADS: u32 = 64;
/// Most jobs the DH pool may be allowed to hold.
pub const MAX_DH_QUEUE: u32 = 65536;

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            digests: mask(&DIGESTS),
            dhgroups: mask(&DHGROUPS),
            dh_threads: 1,
            // A controller's queues re-authenticating at once (Linux
            // starts every I/O queue's exchange together): 127 I/O
            // queues and the admin queue.
            dh_queue_per_host: 128,
            // At most one job per queue: the default max_connections.
            dh_queue_max: 1024,
        }
    }
}

fn mask(t: &[(&str, u8)]) -> u8 {
    t.iter().fold(0, |m, (_, id)| m | 1 << id)
}

/// The mask of the names `names` of table `t`; an unknown name is the
/// error (with what is known).
pub fn names_to_mask<'a>(
    t: &[(&str, u8)],
    names: impl IntoIterator<Item = &'a str>,
) -> Result<u8, String> {
    let mut m = 0;
    for n in names {
        let n = n.trim();
        let Some((_, id)) = t.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)) else {
            let known: Vec<&str> = t.iter().map(|(k, _)| *k).collect();
            return Err(format!("'{n}' is not one of {}", known.join(", ")));
        };
        m |= 1 << id;
    }
    if m == 0 {
        return Err("an empty list".into());
    }
    Ok(m)
}

/// The names of mask `m` of table `t` ([`DIGESTS`] or [`DHGROUPS`]), in
/// the table's order.
pub fn mask_to_names(t: &[(&'static str, u8)], m: u8) -> Vec<&'static str> {
    t.iter()
        .filter(|(_, id)| m & (1 << id) != 0)
        .map(|(k, _)| *k)
        .collect()
}
