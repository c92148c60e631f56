//! The bdevs of a running app (a target, bdevperf) by name: what the
//! configuration file made and what JSON-RPC methods create and delete,
//! alike. Each bdev keeps the `{"method", "params"}` object that made it,
//! for `save_config`, and whether something uses it (a namespace: a
//! "claim", as SPDK's bdev claims), which refuses its deletion.
//!
//! Shared as `Arc<Registry>`; one `Mutex` inside, taken by management
//! calls only (never on the I/O path: I/O goes through channels of the
//! [`Bdev`]s handed out).
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use crate::bdev::Bdev;

/// Why a registry call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("bdev '{0}' already exists")]
    Exists(String),
    #[error("bdev '{0}' not found")]
    NotFound(String),
    /// The bdev is claimed (e.g. a namespace of a subsystem uses it).
    #[error("bdev '{name}' is in use by {by}")]
    Claimed { name: String, by: String },
    /// Something holds the bdev open (a descriptor or channels).
    #[error("bdev '{0}' is open")]
    Open(String),
}

struct Slot {
    name: String,
    bdev: Bdev,
    config: Value,
    /// More entries after `config` that make the bdev with it (the other
    /// paths of a multipath NVMe controller).
    more: Vec<Value>,
    claimed_by: Option<String>,
}

/// The bdevs by name, in the order they were added.
#[derive(Default)]
pub struct Registry {
    slots: Mutex<Vec<Slot>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.lock().iter().map(|s| s.name.clone()).collect();
        f.debug_struct("Registry").field("bdevs", &names).finish()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        // A panic while holding the lock leaves the list consistent (every
        // change is one push or remove).
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `bdev` as `name`; `config_entry` is the `{"method", "params"}`
    /// that made it (written by [`Registry::save_config`]). A name in use
    /// is refused.
    pub fn insert(&self, name: &str, bdev: Bdev, config_entry: Value) -> Result<(), RegistryError> {
        self.insert_all(vec![(name.to_string(), bdev)], config_entry)
    }

    /// Adds several bdevs made by one entry (an NVMe controller's
    /// namespaces), all or none.
    pub fn insert_all(
        &self,
        bdevs: Vec<(String, Bdev)>,
        config_entry: Value,
    ) -> Result<(), RegistryError> {
        self.insert_entries(bdevs, vec![config_entry])
    }

    /// As [`Registry::insert_all`], made by several config entries
    /// together (`save_config` writes them all, in order): a multipath
    /// NVMe controller's, one per path. The first is what
    /// [`Registry::names_where`] looks at.
    pub fn insert_entries(
        &self,
        bdevs: Vec<(String, Bdev)>,
        entries: Vec<Value>,
    ) -> Result<(), RegistryError> {
        let mut slots = self.lock();
        for (i, (n, _)) in bdevs.iter().enumerate() {
            if slots.iter().any(|s| &s.name == n) || bdevs[..i].iter().any(|(m, _)| m == n) {
                return Err(RegistryError::Exists(n.clone()));
            }
        }
        let at = slots.len();
        Self::put(&mut slots, at, bdevs, entries);
        Ok(())
    }

    /// Puts `bdevs` at index `at` of `slots`.
    fn put(slots: &mut Vec<Slot>, at: usize, bdevs: Vec<(String, Bdev)>, mut entries: Vec<Value>) {
        let config = if entries.is_empty() {
            Value::Null
        } else {
            entries.remove(0)
        };
        let new: Vec<Slot> = bdevs
            .into_iter()
            .map(|(name, bdev)| Slot {
                name,
                bdev,
                config: config.clone(),
                more: entries.clone(),
                claimed_by: None,
            })
            .collect();
        slots.splice(at..at, new);
    }

    /// The config entries that made `name` (empty if there is no such
    /// bdev).
    pub fn entries_of(&self, name: &str) -> Vec<Value> {
        self.lock()
            .iter()
            .find(|s| s.name == name)
            .map(|s| {
                std::iter::once(s.config.clone())
                    .chain(s.more.iter().cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether every bdev of `names` is there and unused: neither claimed
    /// nor open (no descriptor, channel or other handle out of the
    /// registry).
    pub fn check_unused(&self, names: &[&str]) -> Result<(), RegistryError> {
        Self::unused(&self.lock(), names)
    }

    fn unused(slots: &[Slot], names: &[&str]) -> Result<(), RegistryError> {
        for n in names {
            let s = slots
                .iter()
                .find(|s| s.name == *n)
                .ok_or_else(|| RegistryError::NotFound(n.to_string()))?;
            if let Some(by) = &s.claimed_by {
                return Err(RegistryError::Claimed {
                    name: n.to_string(),
                    by: by.clone(),
                });
            }
            if std::sync::Arc::strong_count(&s.bdev.0) > 1 {
                return Err(RegistryError::Open(n.to_string()));
            }
        }
        Ok(())
    }

    /// Replaces the bdevs `old` by `new` (made by `entries`), where the
    /// first of `old` was, all or nothing: refused if one of `old` is
    /// missing, claimed or open ([`Registry::check_unused`], checked under
    /// the same lock), or a name of `new` is another bdev's. Returns the
    /// old bdevs.
    pub fn replace(
        &self,
        old: &[&str],
        new: Vec<(String, Bdev)>,
        entries: Vec<Value>,
    ) -> Result<Vec<Bdev>, RegistryError> {
        let mut slots = self.lock();
        Self::unused(&slots, old)?;
        for (i, (n, _)) in new.iter().enumerate() {
            let other = slots
                .iter()
                .any(|s| &s.name == n && !old.contains(&n.as_str()));
            if other || new[..i].iter().any(|(m, _)| m == n) {
                return Err(RegistryError::Exists(n.clone()));
            }
        }
        let at = old
            .iter()
            .filter_map(|n| slots.iter().position(|s| s.name == *n))
            .min()
            .unwrap_or(slots.len());
        let mut out = Vec::with_capacity(old.len());
        for n in old {
            if let Some(i) = slots.iter().position(|s| s.name == *n) {
                out.push(slots.remove(i).bdev);
            }
        }
        let at = at.min(slots.len());
        Self::put(&mut slots, at, new, entries);
        Ok(out)
    }

    pub fn get(&self, name: &str) -> Option<Bdev> {
        self.lock()
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.bdev.clone())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.lock().iter().any(|s| s.name == name)
    }

    /// Removes `name`; refused if it is claimed.
    pub fn remove(&self, name: &str) -> Result<Bdev, RegistryError> {
        let mut v = self.remove_all(&[name])?;
        Ok(v.remove(0))
    }

    /// Removes every bdev of `names`, all or none: refused if one is
    /// missing or claimed.
    pub fn remove_all(&self, names: &[&str]) -> Result<Vec<Bdev>, RegistryError> {
        let mut slots = self.lock();
        for n in names {
            let s = slots
                .iter()
                .find(|s| s.name == *n)
                .ok_or_else(|| RegistryError::NotFound(n.to_string()))?;
            if let Some(by) = &s.claimed_by {
                return Err(RegistryError::Claimed {
                    name: n.to_string(),
                    by: by.clone(),
                });
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some(i) = slots.iter().position(|s| s.name == *n) {
                out.push(slots.remove(i).bdev);
            }
        }
        Ok(out)
    }

    /// The bdevs, in the order they were added.
    pub fn list(&self) -> Vec<(String, Bdev)> {
        self.lock()
            .iter()
            .map(|s| (s.name.clone(), s.bdev.clone()))
            .collect()
    }

    /// The names of the bdevs whose config entry satisfies `f` (e.g. those
    /// of one NVMe controller).
    pub fn names_where(&self, f: impl Fn(&Value) -> bool) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|s| f(&s.config))
            .map(|s| s.name.clone())
            .collect()
    }

    /// The config entries that made the bdevs, in order, each once (an
    /// NVMe controller's several bdevs share one): the `bdev` subsystem's
    /// `config` array of `save_config`.
    pub fn save_config(&self) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        for s in self.lock().iter() {
            if !out.contains(&s.config) {
                out.push(s.config.clone());
                out.extend(s.more.iter().cloned());
            }
        }
        out
    }

    /// Marks `name` as used by `by` (e.g. "subsystem nqn...:cnode1"), which
    /// refuses its removal until [`Registry::release`]. A bdev claimed by
    /// another user is refused.
    pub fn claim(&self, name: &str, by: &str) -> Result<Bdev, RegistryError> {
        let mut slots = self.lock();
        let s = slots
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        match &s.claimed_by {
            Some(other) if other != by => Err(RegistryError::Claimed {
                name: name.to_string(),
                by: other.clone(),
            }),
            _ => {
                s.claimed_by = Some(by.to_string());
                Ok(s.bdev.clone())
            }
        }
    }

    /// Undoes [`Registry::claim`] (a missing bdev is ignored).
    pub fn release(&self, name: &str) {
        if let Some(s) = self.lock().iter_mut().find(|s| s.name == name) {
            s.claimed_by = None;
        }
    }

    /// Who claimed `name`, if anyone.
    pub fn claimed_by(&self, name: &str) -> Option<String> {
        self.lock()
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.claimed_by.clone())
    }

    /// The first of `<prefix>0`, `<prefix>1`, ... not in use (SPDK's names
    /// for unnamed malloc bdevs).
    pub fn free_name(&self, prefix: &str) -> String {
        let slots = self.lock();
        (0u64..)
            .map(|k| format!("{prefix}{k}"))
            .find(|n| !slots.iter().any(|s| &s.name == n))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Entry, NvmeAttach};
    use serde_json::json;

    fn make(method: &str, params: Value) -> (Entry, Vec<Bdev>) {
        let mut w = Vec::new();
        let obj = params.as_object().unwrap().clone();
        let e = Entry::decode(method, &obj, &mut w).unwrap().unwrap();
        let b = e
            .create(&mut |_: &NvmeAttach| Err::<Vec<Bdev>, _>("no nvme"))
            .unwrap();
        (e, b)
    }

    #[test]
    fn names_are_unique_and_claims_refuse_removal() {
        let r = Registry::new();
        let (e, b) = make(
            "bdev_null_create",
            json!({"name": "Null0", "num_blocks": 64, "block_size": 512}),
        );
        r.insert("Null0", b[0].clone(), e.saved_config(&b)).unwrap();
        assert_eq!(
            r.insert("Null0", b[0].clone(), json!({})),
            Err(RegistryError::Exists("Null0".into()))
        );
        assert_eq!(r.get("Null0").unwrap().info().num_blocks, 64);
        assert!(r.get("nope").is_none());
        r.claim("Null0", "subsystem nqn.a").unwrap();
        assert_eq!(
            r.claim("Null0", "subsystem nqn.b")
                .err()
                .unwrap()
                .to_string(),
            "bdev 'Null0' is in use by subsystem nqn.a"
        );
        let e = r.remove("Null0").err().unwrap();
        assert_eq!(e.to_string(), "bdev 'Null0' is in use by subsystem nqn.a");
        assert_eq!(r.claimed_by("Null0").as_deref(), Some("subsystem nqn.a"));
        r.release("Null0");
        assert!(r.remove("Null0").is_ok());
        assert_eq!(
            r.remove("Null0").err().unwrap(),
            RegistryError::NotFound("Null0".into())
        );
        assert!(r.list().is_empty());
    }

    #[test]
    fn insert_all_and_remove_all_are_all_or_nothing() {
        let r = Registry::new();
        let (_, a) = make(
            "bdev_null_create",
            json!({"name": "a", "num_blocks": 8, "block_size": 512}),
        );
        let (_, b) = make(
            "bdev_null_create",
            json!({"name": "b", "num_blocks": 8, "block_size": 512}),
        );
        let entry = json!({"method": "bdev_nvme_attach_controller", "params": {"name": "N"}});
        r.insert("a", a[0].clone(), json!({"method": "x"})).unwrap();
        assert!(r
            .insert_all(
                vec![("b".into(), b[0].clone()), ("a".into(), a[0].clone())],
                entry.clone()
            )
            .is_err());
        assert!(!r.contains("b"), "nothing added");
        r.insert_all(vec![("b".into(), b[0].clone())], entry.clone())
            .unwrap();
        r.insert("c", a[0].clone(), entry.clone()).unwrap();
        assert_eq!(
            r.names_where(|c| c["method"] == "bdev_nvme_attach_controller"),
            ["b", "c"]
        );
        // One entry per controller in save_config.
        assert_eq!(r.save_config(), vec![json!({"method": "x"}), entry]);
        r.claim("c", "ns").unwrap();
        assert!(r.remove_all(&["b", "c"]).is_err());
        assert!(r.contains("b"), "nothing removed");
        r.release("c");
        assert_eq!(r.remove_all(&["b", "c"]).unwrap().len(), 2);
        assert_eq!(r.free_name("a"), "a0");
    }

    #[test]
    fn replace_is_all_or_nothing_and_keeps_the_place() {
        let r = Registry::new();
        let bdev = |n: &str| {
            make(
                "bdev_null_create",
                json!({"name": n, "num_blocks": 8, "block_size": 512}),
            )
            .1
            .remove(0)
        };
        let (a, b, c) = (bdev("a"), bdev("b"), bdev("c"));
        let two = vec![json!({"m": 1}), json!({"m": 2})];
        r.insert("a", a.clone(), json!({"m": 0})).unwrap();
        r.insert_entries(vec![("b".into(), b.clone())], two.clone())
            .unwrap();
        r.insert("c", c.clone(), json!({"m": 3})).unwrap();
        assert_eq!(r.entries_of("b"), two);
        assert_eq!(
            r.save_config(),
            [
                json!({"m": 0}),
                json!({"m": 1}),
                json!({"m": 2}),
                json!({"m": 3})
            ]
        );
        // Open elsewhere (the clone held here): refused, nothing changed.
        assert_eq!(
            r.replace(&["b"], vec![("b".into(), bdev("b"))], vec![json!({"m": 9})])
                .err(),
            Some(RegistryError::Open("b".into()))
        );
        drop(b);
        // A new name that is another bdev's: refused.
        assert_eq!(
            r.replace(&["b"], vec![("c".into(), bdev("c"))], vec![])
                .err(),
            Some(RegistryError::Exists("c".into()))
        );
        r.claim("b", "ns").unwrap();
        assert!(matches!(
            r.check_unused(&["b"]),
            Err(RegistryError::Claimed { .. })
        ));
        r.release("b");
        r.check_unused(&["b"]).unwrap();
        let old = r
            .replace(&["b"], vec![("b".into(), bdev("b"))], vec![json!({"m": 9})])
            .unwrap();
        assert_eq!(old.len(), 1);
        let names: Vec<String> = r.list().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(
            r.save_config(),
            [json!({"m": 0}), json!({"m": 9}), json!({"m": 3})]
        );
    }

    #[test]
    fn saved_config_makes_the_same_bdev_again() {
        let (e, b) = make(
            "bdev_malloc_create",
            json!({"name": "M", "num_blocks": 16, "block_size": 4096}),
        );
        let saved = e.saved_config(&b);
        assert_eq!(saved["method"], "bdev_malloc_create");
        assert_eq!(saved["params"]["uuid"], b[0].info().uuid_string());
        let (_, again) = make("bdev_malloc_create", saved["params"].clone());
        let (x, y) = (b[0].info(), again[0].info());
        assert_eq!(
            (&x.name, x.block_size, x.num_blocks, x.uuid, x.backend),
            (&y.name, y.block_size, y.num_blocks, y.uuid, y.backend)
        );
    }
}
