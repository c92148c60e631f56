//! Which transport type a target's NVMe namespaces use, decided before
//! the target (monomorphised over it) is built: from `--nvme` and the
//! `bdev_nvme_attach_controller` entries of `-c`. The controllers are
//! opened by the shared opener (`crate::nvme_open`).
use serde_json::Value;

use super::TargetCliError;
use pollux_host::Trid;

/// Which transport type a target's NVMe bdevs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `trtype:soft` and `trtype:pcie`.
    Pcie,
    /// `trtype:tcp`.
    Tcp,
}

impl Kind {
    pub fn of(t: &Trid) -> Kind {
        match t {
            Trid::Soft(_) | Trid::Pcie { .. } => Kind::Pcie,
            Trid::Tcp(_) => Kind::Tcp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pcie => "trtype:soft/pcie",
            Kind::Tcp => "trtype:tcp",
        }
    }
}

/// One kind for every source, or an error naming the two that differ.
pub fn one_kind(found: &[(Kind, String)]) -> Result<Option<Kind>, TargetCliError> {
    let Some((k, first)) = found.first() else {
        return Ok(None);
    };
    if let Some((o, other)) = found.iter().find(|(o, _)| o != k) {
        return Err(TargetCliError::Mixed(format!(
            "{first} ({}) and {other} ({}): one target serves NVMe bdevs of one transport type",
            k.name(),
            o.name()
        )));
    }
    Ok(Some(*k))
}

/// The transport kinds the `bdev_nvme_attach_controller` entries of a JSON
/// configuration name (each with the entry's name), read before the
/// target's type is chosen. Malformed documents yield nothing here (the
/// configuration's own reader names the problem).
pub fn config_kinds(json: &str) -> Result<Vec<(Kind, String)>, String> {
    let Ok(doc) = serde_json::from_str::<Value>(json) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let subsystems = doc.get("subsystems").and_then(Value::as_array);
    for s in subsystems.into_iter().flatten() {
        if s.get("subsystem").and_then(Value::as_str) != Some("bdev") {
            continue;
        }
        for e in s
            .get("config")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if e.get("method").and_then(Value::as_str) != Some("bdev_nvme_attach_controller") {
                continue;
            }
            let p = e.get("params");
            let name = p
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            let trtype = p
                .and_then(|p| p.get("trtype"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let what = format!("bdev_nvme_attach_controller '{name}'");
            let k = match trtype.to_ascii_lowercase().as_str() {
                "tcp" => Kind::Tcp,
                "pcie" | "soft" => Kind::Pcie,
                o => {
                    return Err(format!(
                        "{what}: trtype '{o}' is not supported here (soft, PCIe or TCP)"
                    ))
                }
            };
            out.push((k, what));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_of_a_configuration_and_mixing() {
        let j = r#"{"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_nvme_attach_controller", "params": {"name": "A", "trtype": "soft"}},
            {"method": "bdev_malloc_create", "params": {"name": "M", "num_blocks": 8, "block_size": 512}},
            {"method": "bdev_nvme_attach_controller", "params": {"name": "B", "trtype": "tcp"}}]}]}"#;
        let k = config_kinds(j).unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!((k[0].0, k[1].0), (Kind::Pcie, Kind::Tcp));
        let e = one_kind(&k).unwrap_err().to_string();
        assert!(e.contains("'A'") && e.contains("'B'"), "{e}");
        assert_eq!(one_kind(&k[..1]).unwrap(), Some(Kind::Pcie));
        assert_eq!(one_kind(&[]).unwrap(), None);
        assert!(config_kinds(r#"{"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_nvme_attach_controller", "params": {"name": "C", "trtype": "rdma"}}]}]}"#)
            .unwrap_err()
            .contains("'C'"));
    }
}
