//! NVMe controllers behind target namespaces: `--nvme TRID` (perf's
//! transport ID syntax: `trtype:soft ...` an emulated controller on a
//! device thread, `trtype:pcie traddr:...` a device bound to vfio-pci /
//! uio_pci_generic, `trtype:tcp ...` another NVMe/TCP target) and
//! `bdev_nvme_attach_controller` in `-c` (its parameters are the TRID's
//! keys: `trtype`, `traddr`, `adrfam`, `trsvcid`, `subnqn`, `hostnqn`,
//! `hdgst`, `ddgst`, and for `soft` `backend`, `size`, `lbads`, `ns`, ...).
//!
//! A target's NVMe bdevs share one transport type (the target is
//! monomorphised over it): PCIe and the emulated controller, or TCP.
use std::sync::Arc;

use pollux_bdev::config::NvmeAttach;
use pollux_bdev::Bdev;
use pollux_pcie::platform::soft::SoftMode;
use pollux_pcie::{ControllerOptions, Pcie, QpairOptions};
use pollux_softnvme::{DeviceThread, SoftDevice};
use serde_json::Value;

use super::{bad, TargetCliError};
use crate::perf::{open_device, parse_with_limits, Ctrl, SoftLimits, Trid};

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
            Trid::Soft { .. } | Trid::Pcie { .. } => Kind::Pcie,
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

/// The transports a target's NVMe bdevs may use.
pub trait TargetTransport: pollux_nvme::Transport {
    /// The controller if it is of this transport, else an error naming it.
    fn take(c: Ctrl, what: &str) -> Result<pollux_nvme::Controller<Self>, TargetCliError>;
}

impl TargetTransport for Pcie {
    fn take(c: Ctrl, what: &str) -> Result<pollux_pcie::Controller, TargetCliError> {
        match c {
            Ctrl::Pcie(c) => Ok(c),
            Ctrl::Tcp(_) => Err(TargetCliError::Mixed(format!(
                "{what}: trtype:tcp cannot be mixed with trtype:soft/pcie controllers in one target"
            ))),
        }
    }
}

impl TargetTransport for pollux_tcp::TcpTransport {
    fn take(c: Ctrl, what: &str) -> Result<pollux_tcp::Controller, TargetCliError> {
        match c {
            Ctrl::Tcp(c) => Ok(c),
            Ctrl::Pcie(_) => Err(TargetCliError::Mixed(format!(
                "{what}: trtype:soft/pcie cannot be mixed with trtype:tcp controllers in one target"
            ))),
        }
    }
}

/// Opens controllers and keeps them (and the device thread) alive while
/// the target runs. Fields drop in order: controllers, then emulated
/// devices, then the device thread their orderly shutdown needs. Drop it
/// after the target (whose bdevs hold the controllers' queue pairs).
pub struct Opener<T: TargetTransport> {
    ctrls: Vec<Arc<pollux_nvme::Controller<T>>>,
    softs: Vec<Arc<SoftDevice>>,
    dev_thread: Option<DeviceThread>,
    /// Where the emulated controllers' thread runs.
    device_core: Option<usize>,
}

impl<T: TargetTransport> Opener<T> {
    /// `device_core`: the emulated controllers' thread's core (None: not
    /// pinned).
    pub fn new(device_core: Option<usize>) -> Opener<T> {
        Opener {
            ctrls: Vec::new(),
            softs: Vec::new(),
            dev_thread: None,
            device_core,
        }
    }

    /// `--nvme TRID`: controller `name`, bdevs `<name>n<nsid>`.
    pub fn open_trid(&mut self, name: &str, trid: &str) -> Result<Vec<Bdev<T>>, TargetCliError> {
        let (t, limits) =
            parse_with_limits(trid).map_err(|e| bad("--nvme", trid, e.to_string()))?;
        self.open(name, &t, limits, &format!("--nvme '{trid}'"))
    }

    /// `bdev_nvme_attach_controller` from `-c`.
    pub fn attach(&mut self, att: &NvmeAttach) -> Result<Vec<Bdev<T>>, String> {
        let what = format!("bdev_nvme_attach_controller '{}'", att.name);
        let (t, limits) = attach_trid(att).map_err(|e| format!("{what}: {e}"))?;
        self.open(&att.name, &t, limits, &what)
            .map_err(|e| e.to_string())
    }

    fn open(
        &mut self,
        name: &str,
        t: &Trid,
        limits: SoftLimits,
        what: &str,
    ) -> Result<Vec<Bdev<T>>, TargetCliError> {
        let fail = |e: String| TargetCliError::Nvme {
            what: what.to_string(),
            why: e,
        };
        if matches!(t, Trid::Soft { .. }) && self.dev_thread.is_none() {
            self.dev_thread = Some(
                DeviceThread::spawn(self.device_core)
                    .map_err(|e| fail(format!("emulated controller thread: {e}")))?,
            );
        }
        let d = open_device(
            t,
            limits,
            self.ctrls.len(),
            SoftMode::Threaded,
            self.dev_thread.as_ref(),
            &ControllerOptions::default(),
        )
        .map_err(|e| fail(e.to_string()))?;
        let ctrl = Arc::new(T::take(d.ctrl, what)?);
        if let Some(s) = d.soft {
            self.softs.push(s);
        }
        self.ctrls.push(ctrl.clone());
        let mut bdevs = Vec::new();
        for ns in ctrl.namespaces() {
            let b = Bdev::nvme(
                &format!("{name}n{}", ns.nsid),
                ctrl.clone(),
                ns.nsid,
                QpairOptions::default(),
            )
            .map_err(|e| fail(e.to_string()))?;
            bdevs.push(b);
        }
        if bdevs.is_empty() {
            return Err(fail(format!(
                "controller {} has no active namespace",
                d.name
            )));
        }
        Ok(bdevs)
    }
}

/// The transport ID of a `bdev_nvme_attach_controller` entry: `trtype`,
/// `traddr` and every other parameter as a TRID key (strings, numbers,
/// booleans as 0/1); the TRID parser refuses the keys it does not know.
pub fn attach_trid(att: &NvmeAttach) -> Result<(Trid, SoftLimits), String> {
    let mut s = format!("trtype:{}", att.trtype.to_ascii_lowercase());
    if let Some(a) = &att.traddr {
        s.push_str(&format!(" traddr:{a}"));
    }
    for (k, v) in &att.params {
        let v = match v {
            Value::String(x) => x.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => u8::from(*b).to_string(),
            v => {
                return Err(format!(
                    "parameter '{k}': expected a string, a number or a boolean, got {v}"
                ))
            }
        };
        if v.is_empty() || v.contains(char::is_whitespace) || k.contains(char::is_whitespace) {
            return Err(format!(
                "parameter '{k}': '{v}' is empty or contains white space"
            ));
        }
        s.push_str(&format!(" {k}:{v}"));
    }
    parse_with_limits(&s).map_err(|e| e.to_string())
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
    use std::collections::BTreeMap;

    fn att(trtype: &str, traddr: Option<&str>, params: &[(&str, Value)]) -> NvmeAttach {
        NvmeAttach {
            name: "Nvme0".into(),
            trtype: trtype.into(),
            traddr: traddr.map(str::to_string),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn attach_parameters_become_a_trid() {
        let (t, l) = attach_trid(&att(
            "soft",
            None,
            &[
                ("backend", "ram".into()),
                ("size", "1MiB".into()),
                ("mdts", 1.into()),
            ],
        ))
        .unwrap();
        assert!(matches!(t, Trid::Soft { size: 1048576, .. }), "{t:?}");
        assert_eq!(l.mdts, Some(1));
        let (t, _) = attach_trid(&att(
            "TCP",
            Some("127.0.0.1"),
            &[
                ("trsvcid", "4420".into()),
                ("subnqn", "nqn.2024-01.io.pollux:x".into()),
                ("ddgst", true.into()),
            ],
        ))
        .unwrap();
        let Trid::Tcp(t) = t else { panic!("{t:?}") };
        assert!(t.ddgst && !t.hdgst && t.trsvcid == 4420);
        for (a, want) in [
            (att("rdma", Some("1.2.3.4"), &[]), "rdma"),
            (att("soft", None, &[("colour", "blue".into())]), "colour"),
            (att("soft", None, &[("path", "a b".into())]), "white space"),
        ] {
            let msg = attach_trid(&a).unwrap_err();
            assert!(msg.contains(want), "{msg}");
        }
    }

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
