//! The decoder of `bdev_nvme_attach_controller` (see [`crate::config`]).
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::params::{ParamError, Params};

/// `bdev_nvme_attach_controller`: what the caller needs to open the
/// controller. Its bdevs are named [`bdev_name`](Self::bdev_name).
#[derive(Clone, Debug, PartialEq)]
pub struct NvmeAttach {
    /// The controller's name, prefix of its bdevs' names.
    pub name: String,
    /// As given (`pcie`, `rdma`, ..., or a transport of the caller's own).
    pub trtype: String,
    pub traddr: Option<String>,
    /// Every other parameter, unchanged: the caller interprets them and
    /// refuses those it does not know.
    pub params: BTreeMap<String, Value>,
    /// More paths to the same namespace: later
    /// `bdev_nvme_attach_controller` entries of the same name with
    /// `"multipath": "multipath"` (SPDK's multipath mode), in order
    /// (their own `paths` empty). Empty: one path.
    pub paths: Vec<NvmeAttach>,
}

impl NvmeAttach {
    /// SPDK's name of namespace `nsid`'s bdev: `<name>n<nsid>`.
    pub fn bdev_name(&self, nsid: u32) -> String {
        format!("{}n{nsid}", self.name)
    }

    /// Adds `p` as one more path (SPDK's multipath mode: the entries'
    /// `multipath` parameter is then implied and dropped from both).
    pub fn add_path(&mut self, mut p: NvmeAttach) {
        p.params.remove("multipath");
        self.params.remove("multipath");
        self.paths.extend(std::mem::take(&mut p.paths));
        self.paths.push(p);
    }

    /// Every path, the first one (this entry's own) first; each without
    /// its `paths`.
    pub fn each_path(&self) -> Vec<NvmeAttach> {
        let first = NvmeAttach {
            paths: Vec::new(),
            ..self.clone()
        };
        std::iter::once(first)
            .chain(self.paths.iter().cloned())
            .collect()
    }

    /// The entry of the paths `list` (the first one's, with the others as
    /// its `paths`); None if `list` is empty.
    pub fn of_paths(list: Vec<NvmeAttach>) -> Option<NvmeAttach> {
        let mut it = list.into_iter();
        let mut first = it.next()?;
        for p in it {
            first.add_path(p);
        }
        Some(first)
    }
}

/// `bdev_nvme_attach_controller`: its own parameters are read, the rest
/// go to the caller unchanged.
pub(crate) fn attach_controller(obj: &Map<String, Value>) -> Result<NvmeAttach, ParamError> {
    // Only these are read here; the rest go to the caller.
    const OWN: &[&str] = &["name", "trtype", "traddr"];
    let own: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| OWN.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let p = Params::with_known("bdev_nvme_attach_controller", &own, OWN)?;
    let name = p.required("name", p.name(true)?)?.to_string();
    let trtype = p.str_req("trtype")?.to_string();
    let traddr = p.str_opt("traddr")?.map(str::to_string);
    Ok(NvmeAttach {
        name,
        trtype,
        traddr,
        params: obj
            .iter()
            .filter(|(k, _)| !OWN.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        paths: Vec::new(),
    })
}

/// The `multipath` parameter of an entry: `Some(true)` for SPDK's
/// "multipath" mode, `Some(false)` for "disable"; "failover" (SPDK's
/// second path kept idle) and other values are refused.
pub fn multipath_mode(a: &NvmeAttach) -> Result<Option<bool>, String> {
    match a.params.get("multipath") {
        None => Ok(None),
        Some(Value::String(s)) if s == "multipath" => Ok(Some(true)),
        Some(Value::String(s)) if s == "disable" => Ok(Some(false)),
        Some(v) => Err(format!(
            "multipath {v}: only \"multipath\" (or \"disable\") is supported"
        )),
    }
}
