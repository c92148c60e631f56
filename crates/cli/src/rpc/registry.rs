//! An app's bdevs made at start-up (`-c` file, quick flags) into the
//! [`Registry`], each with the config entry that makes it again, so that
//! they are alike with those JSON-RPC creates.
use pollux_bdev::config::{Config, Entry};
use pollux_bdev::{Bdev, Registry, RegistryError};
use serde_json::{json, Map, Value};

/// Whether `bdev` is a bdev of NVMe controller `ctrl` (`<ctrl>n<nsid>`).
fn of_controller(ctrl: &str, bdev: &str) -> bool {
    bdev.strip_prefix(ctrl)
        .and_then(|r| r.strip_prefix('n'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

/// Who claims a namespace's bdev (`Registry::claim`; what a refused
/// delete names): "subsystem <nqn>".
pub fn claimer(nqn: &str) -> String {
    format!("subsystem {nqn}")
}

/// The bdev entries of an SPDK JSON configuration's text (parsed again:
/// the app checked it already; none if it has no bdev subsystem).
pub fn bdev_entries(json: &str) -> Vec<Entry> {
    let parse = || {
        let doc: Value = serde_json::from_str(json).ok()?;
        let bdev: Vec<Value> = pollux_bdev::config::subsystems(&doc)
            .ok()?
            .iter()
            .filter(|s| s["subsystem"] == "bdev")
            .cloned()
            .collect();
        Config::parse(&json!({ "subsystems": bdev }).to_string()).ok()
    };
    parse().map(|c| c.entries).unwrap_or_default()
}

/// `bdev_nvme_attach_controller` of controller `name` at `trid` (the
/// TRID's keys are the method's parameters).
pub fn trid_entry(name: &str, trid: &str) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), name.into());
    for kv in trid.split_whitespace() {
        if let Some((k, v)) = kv.split_once(':') {
            p.insert(k.to_string(), v.into());
        }
    }
    json!({"method": "bdev_nvme_attach_controller", "params": p})
}

/// The registry of `bdevs`: those an entry of `entries` made get its
/// saved config; the others `other(bdev)`.
pub fn registry_of(
    bdevs: &[Bdev],
    entries: &[Entry],
    other: impl Fn(&Bdev) -> Value,
) -> Result<Registry, RegistryError> {
    let r = Registry::new();
    let mut done = vec![false; bdevs.len()];
    for e in entries {
        let made: Vec<usize> = (0..bdevs.len())
            .filter(|&k| {
                !done[k]
                    && match e {
                        Entry::NvmeAttach(n) => of_controller(&n.name, bdevs[k].name()),
                        e => e.name() == bdevs[k].name(),
                    }
            })
            .collect();
        if made.is_empty() {
            continue;
        }
        let mine: Vec<Bdev> = made.iter().map(|&k| bdevs[k].clone()).collect();
        let saved = e.saved_configs(&mine);
        for &k in &made {
            done[k] = true;
        }
        r.insert_entries(
            mine.into_iter()
                .map(|b| (b.name().to_string(), b))
                .collect(),
            saved,
        )?;
    }
    for (k, b) in bdevs.iter().enumerate() {
        if !done[k] {
            r.insert(b.name(), b.clone(), other(b))?;
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_bdev_names() {
        assert!(of_controller("Nvme0", "Nvme0n1"));
        assert!(of_controller("Nvme0", "Nvme0n12"));
        assert!(!of_controller("Nvme0", "Nvme0n"));
        assert!(!of_controller("Nvme0", "Nvme01n1"));
        assert!(!of_controller("Nvme0", "Null0"));
    }

    #[test]
    fn trid_keys_become_parameters() {
        assert_eq!(
            trid_entry("Nvme0", "trtype:pcie traddr:0000:00:04.0"),
            json!({"method": "bdev_nvme_attach_controller", "params": {
                "name": "Nvme0", "trtype": "pcie", "traddr": "0000:00:04.0"}})
        );
    }
}
