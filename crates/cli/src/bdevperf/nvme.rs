//! NVMe controllers for bdevperf: `--nvme TRID` (perf's transport ID
//! syntax) and `bdev_nvme_attach_controller` in `-c`, over perf's device
//! opening (emulated controllers on a device thread or stepped inline, and
//! PCIe devices bound to vfio-pci / uio_pci_generic).
//!
//! In `-c`, `trtype` `PCIe` takes `traddr`; the other SPDK parameters
//! (fabrics, multipath, reconnect, protection checks) have no meaning for a
//! local PCIe controller here and are ignored with a warning. `trtype`
//! `soft` (pollux's emulated controller) takes the TRID keys as parameters
//! (`backend`, `path`, `size`, `lbads`, `ns`, `mdts`, `mqes`): strings or
//! numbers.
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::config::NvmeAttach;
use pollux_bdev::Bdev;
use pollux_pcie::platform::soft::SoftMode;
use pollux_pcie::{Controller, ControllerOptions, Pcie, QpairOptions};
use pollux_softnvme::{DeviceThread, SoftDevice};
use serde_json::Value;

use super::{bad, BdevperfArgs, BdevperfError};
use crate::perf::{open_device, parse_with_limits, Ctrl, SoftLimits, Trid};

/// SPDK's optional `bdev_nvme_attach_controller` parameters that do not
/// apply to a local PCIe controller here.
const SPDK_IGNORED: &[&str] = &[
    "adrfam",
    "trsvcid",
    "subnqn",
    "hostnqn",
    "hostaddr",
    "hostsvcid",
    "prchk_reftag",
    "prchk_guard",
    "hdgst",
    "ddgst",
    "fabrics_connect_timeout_us",
    "multipath",
    "num_io_queues",
    "ctrlr_loss_timeout_sec",
    "reconnect_delay_sec",
    "fast_io_fail_timeout_sec",
    "psk",
    "max_bdevs",
];

/// Opens controllers and keeps them (and the device thread) alive for the
/// run. Fields drop in order: controllers, then emulated devices, then the
/// device thread their orderly shutdown needs.
pub struct NvmeOpener<T: NvmeTransport> {
    ctrls: Vec<Arc<pollux_nvme::Controller<T>>>,
    softs: Vec<Arc<SoftDevice>>,
    dev_thread: Option<DeviceThread>,
    inline: bool,
    device_core: Option<usize>,
    /// Jobs (queue pairs) per namespace: one, or one per core with -C.
    per_ns: usize,
    copts: ControllerOptions,
    qopts: QpairOptions,
}

/// The transports a bdevperf run's NVMe bdevs may use: one per run (a
/// job's bdevs share one type), PCIe and the emulated controller, or TCP.
pub trait NvmeTransport: pollux_nvme::Transport {
    /// The controller if it is of this transport, else an error naming it.
    fn take(c: Ctrl, what: &str) -> Result<pollux_nvme::Controller<Self>, BdevperfError>;
}

impl NvmeTransport for Pcie {
    fn take(c: Ctrl, what: &str) -> Result<Controller, BdevperfError> {
        match c {
            Ctrl::Pcie(c) => Ok(c),
            Ctrl::Tcp(_) => Err(BdevperfError::Args(format!(
                "{what}: trtype:tcp cannot be mixed with trtype:soft/pcie controllers in one run"
            ))),
        }
    }
}

impl NvmeTransport for pollux_tcp::TcpTransport {
    fn take(c: Ctrl, what: &str) -> Result<pollux_tcp::Controller, BdevperfError> {
        match c {
            Ctrl::Tcp(c) => Ok(c),
            Ctrl::Pcie(_) => Err(BdevperfError::Args(format!(
                "{what}: trtype:soft/pcie cannot be mixed with trtype:tcp controllers in one run"
            ))),
        }
    }
}

impl<T: NvmeTransport> NvmeOpener<T> {
    pub fn new(
        a: &BdevperfArgs,
        cores: &[usize],
        online: &[usize],
    ) -> Result<NvmeOpener<T>, BdevperfError> {
        let per_ns = if a.every_core { cores.len() } else { 1 };
        Ok(NvmeOpener {
            ctrls: Vec::new(),
            softs: Vec::new(),
            dev_thread: None,
            inline: a.inline,
            device_core: a
                .device_core
                .or_else(|| online.iter().copied().find(|c| !cores.contains(c))),
            per_ns,
            copts: ControllerOptions::default(),
            qopts: QpairOptions {
                depth: u16::try_from(a.queue_depth).unwrap_or(u16::MAX),
                timeout: (a.timeout_ms > 0).then(|| Duration::from_millis(a.timeout_ms)),
                ..QpairOptions::default()
            },
        })
    }

    /// The emulated controllers (stepped by the job's thread with --inline).
    pub fn soft_devices(&self) -> Vec<Arc<SoftDevice>> {
        self.softs.clone()
    }

    /// `--nvme TRID`: controller `name`, bdevs `<name>n<nsid>`.
    pub fn open_trid(&mut self, name: &str, trid: &str) -> Result<Vec<Bdev<T>>, BdevperfError> {
        let (t, limits) =
            parse_with_limits(trid).map_err(|e| bad("--nvme", trid, e.to_string()))?;
        self.open(name, &t, limits, || format!("--nvme '{trid}'"))
    }

    /// `bdev_nvme_attach_controller` from `-c`.
    pub fn attach(&mut self, att: &NvmeAttach) -> Result<Vec<Bdev<T>>, BdevperfError> {
        let (t, limits) = attach_trid(att)?;
        self.open(&att.name, &t, limits, || {
            format!("bdev_nvme_attach_controller '{}'", att.name)
        })
    }

    fn open(
        &mut self,
        name: &str,
        t: &Trid,
        limits: SoftLimits,
        what: impl Fn() -> String,
    ) -> Result<Vec<Bdev<T>>, BdevperfError> {
        let soft = matches!(t, Trid::Soft { .. });
        if self.inline && !soft {
            return Err(bad(
                "--inline",
                "",
                format!("{} is not an emulated controller (trtype:soft)", what()),
            ));
        }
        if soft && !self.inline && self.dev_thread.is_none() {
            self.dev_thread =
                Some(DeviceThread::spawn(self.device_core).map_err(|e| {
                    BdevperfError::Args(format!("emulated controller thread: {e}"))
                })?);
        }
        let mode = if self.inline {
            SoftMode::Inline
        } else {
            SoftMode::Threaded
        };
        // Enough queue pairs for every job on the namespaces we know of up
        // front (the controller may grant fewer: channels then fail, named).
        let nns = match t {
            Trid::Soft { namespaces, .. } => *namespaces as usize,
            Trid::Pcie { .. } | Trid::Tcp(_) => 1,
        };
        let mut copts = self.copts.clone();
        copts.io_queues =
            (nns * self.per_ns).clamp(copts.io_queues as usize, u16::MAX as usize - 1) as u16;
        let d = open_device(
            t,
            limits,
            self.ctrls.len(),
            mode,
            self.dev_thread.as_ref(),
            &copts,
        )?;
        let ctrl = Arc::new(T::take(d.ctrl, &what())?);
        if let Some(s) = d.soft {
            self.softs.push(s);
        }
        self.ctrls.push(ctrl.clone());
        let mut bdevs = Vec::new();
        for ns in ctrl.namespaces() {
            bdevs.push(Bdev::nvme(
                &format!("{name}n{}", ns.nsid),
                ctrl.clone(),
                ns.nsid,
                self.qopts.clone(),
            )?);
        }
        if bdevs.is_empty() {
            return Err(BdevperfError::Args(format!(
                "{}: controller {} has no active namespace",
                what(),
                d.name
            )));
        }
        Ok(bdevs)
    }
}

/// The transport ID of a `bdev_nvme_attach_controller` entry.
fn attach_trid(att: &NvmeAttach) -> Result<(Trid, SoftLimits), BdevperfError> {
    let err = |why: String| {
        BdevperfError::Args(format!("bdev_nvme_attach_controller '{}': {why}", att.name))
    };
    match att.trtype.to_ascii_lowercase().as_str() {
        "pcie" => {
            let traddr = att
                .traddr
                .as_deref()
                .ok_or_else(|| err("trtype PCIe needs parameter 'traddr' (the BDF)".into()))?;
            for k in att.params.keys() {
                if SPDK_IGNORED.contains(&k.as_str()) {
                    tracing::warn!(
                        "bdev_nvme_attach_controller '{}': parameter '{k}' ignored (not used for a local PCIe controller)",
                        att.name
                    );
                } else {
                    return Err(err(format!("unknown parameter '{k}'")));
                }
            }
            Ok((
                Trid::Pcie {
                    traddr: traddr.to_string(),
                },
                SoftLimits::default(),
            ))
        }
        "soft" => {
            if att.traddr.is_some() {
                return Err(err(
                    "trtype soft takes no 'traddr' (an emulated controller is made for the run)"
                        .into(),
                ));
            }
            let mut s = String::from("trtype:soft");
            for (k, v) in &att.params {
                let v = match v {
                    Value::String(x) => x.clone(),
                    Value::Number(n) => n.to_string(),
                    v => {
                        return Err(err(format!(
                            "parameter '{k}': expected a string or a number, got {v}"
                        )))
                    }
                };
                if v.is_empty()
                    || v.contains(char::is_whitespace)
                    || k.contains(char::is_whitespace)
                {
                    return Err(err(format!(
                        "parameter '{k}': '{v}' is empty or contains white space"
                    )));
                }
                s.push_str(&format!(" {k}:{v}"));
            }
            parse_with_limits(&s).map_err(|e| err(e.to_string()))
        }
        o => Err(err(format!(
            "trtype '{o}' is not supported here (PCIe, or soft for the emulated controller; TCP through --nvme)"
        ))),
    }
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
    fn attach_parameters_map_to_a_trid() {
        let (t, l) = attach_trid(&att(
            "soft",
            None,
            &[
                ("backend", "ram".into()),
                ("size", "1MiB".into()),
                ("ns", 2.into()),
                ("mdts", 1.into()),
            ],
        ))
        .unwrap();
        assert!(matches!(
            t,
            Trid::Soft {
                size: 1048576,
                namespaces: 2,
                ..
            }
        ));
        assert_eq!(l.mdts, Some(1));
        let (t, _) = attach_trid(&att(
            "PCIe",
            Some("0000:0a:00.0"),
            &[("prchk_reftag", false.into())],
        ))
        .unwrap();
        assert_eq!(
            t,
            Trid::Pcie {
                traddr: "0000:0a:00.0".into()
            }
        );
        for (a, want) in [
            (att("rdma", Some("1.2.3.4"), &[]), "trtype 'rdma'"),
            (att("pcie", None, &[]), "'traddr'"),
            (att("pcie", Some("x"), &[("colour", 1.into())]), "'colour'"),
            (att("soft", None, &[("colour", "blue".into())]), "colour"),
            (att("soft", None, &[("path", "a b".into())]), "white space"),
            (att("soft", Some("x"), &[]), "'traddr'"),
        ] {
            let msg = attach_trid(&a).unwrap_err().to_string();
            assert!(msg.contains("'Nvme0'") && msg.contains(want), "{msg}");
        }
    }
}
