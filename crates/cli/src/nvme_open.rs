//! NVMe controllers behind bdevs, for `pollux bdevperf` and `pollux
//! target`: `--nvme TRID` (the host library's transport ID syntax) and
//! `bdev_nvme_attach_controller` in `-c`, opened by the host library
//! (emulated controllers on a device thread or stepped inline, devices
//! bound to vfio-pci / uio_pci_generic, NVMe/TCP controllers).
//!
//! A run's NVMe bdevs may be of any transport, side by side: PCIe
//! devices, emulated controllers and NVMe/TCP controllers.
//!
//! In `-c`, `trtype`, `traddr` and the other parameters are the TRID's
//! keys (strings, numbers, booleans as 0/1); SPDK's reconnect parameters
//! of a TCP controller become its TRID keys (`ctrlr_loss_timeout_sec` →
//! `ctrl_loss_tmo`, `reconnect_delay_sec` → `reconnect_delay`,
//! `fast_io_fail_timeout_sec` → `fast_io_fail_tmo`, SPDK's 0 = off being
//! Linux's -1); SPDK's parameters that mean nothing to this transport ID
//! (protection checks, and the fabrics ones for a local controller) are
//! ignored with a warning. A later entry of the same name with
//! `"multipath": "multipath"` adds a path: the controller's bdev is then
//! one multipath namespace (the first path's first) over every path
//! ([`NvmeOpener::open_multipath`]); JSON-RPC adds and removes paths of
//! a live controller by opening it again ([`NvmeOpener::take`], see
//! `rpc/nvme.rs`).
use std::sync::Arc;

use pollux_bdev::config::NvmeAttach;
use pollux_bdev::Bdev;
use pollux_host::{trid, Controller, ControllerOptions, Policy, QpairOptions, Selector, Trid};
use pollux_softnvme::SoftDevice;
use serde_json::Value;

use crate::emulator::SoftEmulator;

/// SPDK's optional `bdev_nvme_attach_controller` parameters that are not
/// transport ID keys here (ignored with a warning).
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
    "num_io_queues",
    "ctrlr_loss_timeout_sec",
    "reconnect_delay_sec",
    "fast_io_fail_timeout_sec",
    "psk",
    "max_bdevs",
    // SPDK's client (spdk-rpc) sends these two on every attach.
    "allow_unrecognized_csi",
    "disable_sq_flow_control",
];

/// The keys of a `trtype:tcp` transport ID among [`SPDK_IGNORED`].
const TCP_KEYS: &[&str] = &["adrfam", "trsvcid", "subnqn", "hostnqn", "hdgst", "ddgst"];

/// A controller could not be opened: what was asked (`--nvme '...'`,
/// `bdev_nvme_attach_controller 'name'`) and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
pub struct OpenError {
    pub what: String,
    pub why: String,
    /// A path of a multipath namespace leads to another namespace (or has
    /// none to compare): the path is refused, not the connection.
    pub wrong_path: bool,
}

/// Opens controllers and keeps them (and the emulated devices and their
/// thread) alive for the run. Fields drop in order: controllers, then the
/// emulator, whose device thread their orderly shutdown needs. Drop it
/// after whatever holds its bdevs.
pub struct NvmeOpener {
    ctrls: Vec<Arc<Controller>>,
    /// The name each of `ctrls` was opened as.
    names: Vec<String>,
    /// Multipath namespaces, by controller name.
    mps: Vec<(String, Arc<pollux_host::Multipath>)>,
    emu: SoftEmulator,
    /// Path policies set by `bdev_nvme_set_multipath_policy`, by
    /// controller name (the others: active-active, round robin).
    policies: Vec<(String, Policy, Selector)>,
    /// Queue pairs each namespace needs (one per job on it).
    per_ns: usize,
    qopts: QpairOptions,
}

/// What [`NvmeOpener::take`] took out: dropped, its controllers close
/// once their bdevs are gone too.
#[derive(Default)]
pub struct Taken {
    mps: Vec<(String, Arc<pollux_host::Multipath>)>,
    ctrls: Vec<(String, Arc<Controller>)>,
}

/// One path of a controller ([`NvmeOpener::paths_of`]).
#[derive(Clone, Copy, Debug)]
pub struct PathState {
    pub cntlid: u16,
    pub failed: bool,
}

impl NvmeOpener {
    /// `inline`: emulated controllers stepped by the caller, else on a
    /// device thread pinned to `device_core` (None: not pinned).
    pub fn new(
        inline: bool,
        device_core: Option<usize>,
        per_ns: usize,
        qopts: QpairOptions,
    ) -> NvmeOpener {
        NvmeOpener {
            ctrls: Vec::new(),
            names: Vec::new(),
            mps: Vec::new(),
            policies: Vec::new(),
            emu: SoftEmulator::new(inline, device_core),
            per_ns,
            qopts,
        }
    }

    /// The controllers opened so far.
    pub fn controllers(&self) -> &[Arc<Controller>] {
        &self.ctrls
    }

    /// Forgets controller `name` (`bdev_nvme_detach_controller`): it
    /// closes once its bdevs are gone. Whether it was there.
    pub fn detach(&mut self, name: &str) -> bool {
        self.policies.retain(|(n, ..)| n != name);
        if let Some(i) = self.mps.iter().position(|(n, _)| n == name) {
            self.mps.remove(i);
            return true;
        }
        match self.names.iter().position(|n| n == name) {
            Some(i) => {
                self.names.remove(i);
                self.ctrls.remove(i);
                true
            }
            None => false,
        }
    }

    /// Takes controller `name` out (to open it again over other paths):
    /// [`NvmeOpener::restore`] puts it back.
    pub fn take(&mut self, name: &str) -> Taken {
        let mut t = Taken::default();
        while let Some(i) = self.mps.iter().position(|(n, _)| n == name) {
            t.mps.push(self.mps.remove(i));
        }
        while let Some(i) = self.names.iter().position(|n| n == name) {
            t.ctrls.push((self.names.remove(i), self.ctrls.remove(i)));
        }
        t
    }

    /// The path policy of controller `name` from now on (None: the
    /// default); the one it replaces. A controller open already keeps
    /// its own until it is opened again.
    pub fn set_policy(
        &mut self,
        name: &str,
        p: Option<(Policy, Selector)>,
    ) -> Option<(Policy, Selector)> {
        let old = self.policy_of(name);
        self.policies.retain(|(n, ..)| n != name);
        if let Some((policy, selector)) = p {
            self.policies.push((name.to_string(), policy, selector));
        }
        old
    }

    fn policy_of(&self, name: &str) -> Option<(Policy, Selector)> {
        self.policies
            .iter()
            .find(|(n, ..)| n == name)
            .map(|&(_, p, s)| (p, s))
    }

    /// The path policy controller `name` is open with, if it is open over
    /// several paths.
    pub fn open_policy(&self, name: &str) -> Option<(Policy, Selector)> {
        self.mps
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, mp)| (mp.policy(), mp.selector()))
    }

    /// Puts back what [`NvmeOpener::take`] took.
    pub fn restore(&mut self, t: Taken) {
        self.mps.extend(t.mps);
        for (n, c) in t.ctrls {
            self.names.push(n);
            self.ctrls.push(c);
        }
    }

    /// Controller `name`'s paths, in order (one for a controller of one
    /// path): each one's controller ID and whether it failed for good.
    pub fn paths_of(&self, name: &str) -> Vec<PathState> {
        let state = |c: &Controller| PathState {
            cntlid: c.identify().cntlid,
            failed: c.is_failed(),
        };
        if let Some((_, mp)) = self.mps.iter().find(|(n, _)| n == name) {
            return (0..mp.len())
                .filter_map(|i| mp.controller(i).map(state))
                .collect();
        }
        self.names
            .iter()
            .zip(&self.ctrls)
            .filter(|(n, _)| *n == name)
            .map(|(_, c)| state(c))
            .collect()
    }

    /// The emulated controllers (stepped by the caller in inline mode).
    pub fn soft_devices(&self) -> Vec<Arc<SoftDevice>> {
        self.emu.devices().to_vec()
    }

    /// `--nvme TRID`: controller `name`, bdevs `<name>n<nsid>`.
    pub fn open_trid(&mut self, name: &str, trid: &str) -> Result<Vec<Bdev>, OpenError> {
        let what = format!("--nvme '{trid}'");
        let t = trid::parse(trid).map_err(|e| OpenError {
            what: what.clone(),
            why: e.to_string(),
            wrong_path: false,
        })?;
        self.open(name, &t, what)
    }

    /// `--multipath --nvme TRID...`: one namespace over every transport
    /// ID (see [`NvmeOpener::open_multipath`]).
    pub fn open_paths(&mut self, name: &str, trids: &[String]) -> Result<Vec<Bdev>, OpenError> {
        let what = format!("--multipath --nvme '{}'", trids.join("' --nvme '"));
        let mut ts = Vec::with_capacity(trids.len());
        for t in trids {
            ts.push(trid::parse(t).map_err(|e| OpenError {
                what: format!("--nvme '{t}'"),
                why: e.to_string(),
                wrong_path: false,
            })?);
        }
        self.open_multipath(name, &ts, None, what)
    }

    /// Controller `name` over several paths: a connection to each of
    /// `trids` (through [`pollux_host::multipath::path_trid`]), and one
    /// bdev `<name>n<nsid>` of namespace `nsid` (None: the first path's
    /// first) over all of them; a path to another namespace is refused,
    /// named.
    pub fn open_multipath(
        &mut self,
        name: &str,
        trids: &[Trid],
        nsid: Option<u32>,
        what: String,
    ) -> Result<Vec<Bdev>, OpenError> {
        let fail = |why: String| OpenError {
            what: what.clone(),
            why,
            wrong_path: false,
        };
        if self.emu.inline() {
            return Err(fail(
                "a multipath namespace is not stepped inline (--inline)".into(),
            ));
        }
        let mut copts = ControllerOptions::default();
        copts.io_queues =
            (self.per_ns).clamp(copts.io_queues as usize, u16::MAX as usize - 1) as u16;
        let mut paths = Vec::with_capacity(trids.len());
        for t in trids {
            if matches!(t, Trid::Soft(_)) {
                self.emu
                    .start_thread()
                    .map_err(|e| fail(format!("emulated controller thread: {e}")))?;
            }
            let t = pollux_host::multipath::path_trid(t);
            let ctrl = pollux_host::connect_with(&t, &copts, &mut self.emu)
                .map_err(|e| fail(e.to_string()))?;
            paths.push((ctrl.describe(), ctrl));
        }
        let (policy, selector) = self
            .policy_of(name)
            .unwrap_or((Policy::ActiveActive, Selector::RoundRobin));
        let mp = pollux_host::Multipath::new(paths, nsid, policy, selector).map_err(|e| {
            use pollux_host::MultipathError as M;
            let wrong_path = matches!(
                e,
                M::Mismatch { .. } | M::NoNamespace { .. } | M::NoIdentifier { .. }
            );
            OpenError {
                wrong_path,
                ..fail(e.to_string())
            }
        })?;
        let bdev_name = format!("{name}n{}", mp.namespace().nsid());
        let mp = Arc::new(mp);
        self.mps.push((name.to_string(), mp.clone()));
        let b = Bdev::nvme_multipath(&bdev_name, mp, self.qopts.clone())
            .map_err(|e| fail(e.to_string()))?;
        Ok(vec![b])
    }

    /// `bdev_nvme_attach_controller` from `-c`.
    pub fn attach(&mut self, att: &NvmeAttach) -> Result<Vec<Bdev>, OpenError> {
        let t = attach_trid(att)?;
        if !att.paths.is_empty() {
            // SPDK's multipath mode: the same name attached again adds a
            // path to its namespace (the first path's first).
            let mut ts = vec![t];
            for p in &att.paths {
                ts.push(attach_trid(p)?);
            }
            return self.open_multipath(&att.name, &ts, None, attach_what(att));
        }
        self.open(&att.name, &t, attach_what(att))
    }

    fn open(&mut self, name: &str, t: &Trid, what: String) -> Result<Vec<Bdev>, OpenError> {
        let fail = |why: String| OpenError {
            what: what.clone(),
            why,
            wrong_path: false,
        };
        if self.emu.inline() && !matches!(t, Trid::Soft(_)) {
            return Err(fail(
                "only an emulated controller (trtype:soft) can be stepped inline (--inline)".into(),
            ));
        }
        if matches!(t, Trid::Soft(_)) {
            self.emu
                .start_thread()
                .map_err(|e| fail(format!("emulated controller thread: {e}")))?;
        }
        // Enough queue pairs for every job on the namespaces known up
        // front (the controller may grant fewer: channels then fail, named).
        let nns = match t {
            Trid::Soft(s) => s.namespaces as usize,
            Trid::Pcie { .. } | Trid::Tcp(_) => 1,
        };
        let mut copts = ControllerOptions::default();
        copts.io_queues =
            (nns * self.per_ns).clamp(copts.io_queues as usize, u16::MAX as usize - 1) as u16;
        let ctrl = Arc::new(
            pollux_host::connect_with(t, &copts, &mut self.emu).map_err(|e| fail(e.to_string()))?,
        );
        self.ctrls.push(ctrl.clone());
        self.names.push(name.to_string());
        let mut bdevs = Vec::new();
        for ns in ctrl.namespaces() {
            let b = Bdev::nvme(
                &format!("{name}n{}", ns.nsid()),
                ctrl.clone(),
                ns.nsid(),
                self.qopts.clone(),
            )
            .map_err(|e| fail(e.to_string()))?;
            bdevs.push(b);
        }
        if bdevs.is_empty() {
            return Err(fail(format!(
                "controller {} has no active namespace",
                ctrl.describe()
            )));
        }
        Ok(bdevs)
    }
}

fn attach_what(att: &NvmeAttach) -> String {
    format!("bdev_nvme_attach_controller '{}'", att.name)
}

/// The transport ID of a `bdev_nvme_attach_controller` entry (see the
/// module docs); the TRID parser refuses keys it does not know.
pub fn attach_trid(att: &NvmeAttach) -> Result<Trid, OpenError> {
    let fail = |why: String| OpenError {
        what: attach_what(att),
        why,
        wrong_path: false,
    };
    let trtype = att.trtype.to_ascii_lowercase();
    let mut s = format!("trtype:{trtype}");
    if let Some(a) = &att.traddr {
        s.push_str(&format!(" traddr:{a}"));
    }
    let loss_is_zero = att
        .params
        .get("ctrlr_loss_timeout_sec")
        .is_some_and(|v| v.as_i64() == Some(0) || v.as_str() == Some("0"));
    for (k, v) in &att.params {
        if k == "multipath" {
            // The mode of adding paths (see the module docs), understood.
            continue;
        }
        if trtype == "tcp" {
            if let Some(kv) = spdk_reconnect_param(k, v, loss_is_zero).map_err(fail)? {
                s.push_str(&format!(" {kv}"));
                continue;
            }
        }
        let tcp_key = trtype == "tcp" && TCP_KEYS.contains(&k.as_str());
        if SPDK_IGNORED.contains(&k.as_str()) && !tcp_key {
            tracing::warn!(
                "{}: parameter '{k}' ignored (not used for a trtype:{trtype} controller here)",
                attach_what(att)
            );
            continue;
        }
        let v = match v {
            Value::String(x) => x.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => u8::from(*b).to_string(),
            v => {
                return Err(fail(format!(
                    "parameter '{k}': expected a string, a number or a boolean, got {v}"
                )))
            }
        };
        if v.is_empty() || v.contains(char::is_whitespace) || k.contains(char::is_whitespace) {
            return Err(fail(format!(
                "parameter '{k}': '{v}' is empty or contains white space"
            )));
        }
        s.push_str(&format!(" {k}:{v}"));
    }
    trid::parse(&s).map_err(|e| fail(e.to_string()))
}

/// SPDK's reconnect parameter `k` of a TCP controller as the TRID's
/// `key:value` (None: `k` is not one of them, or SPDK's value means the
/// TRID's default). `loss_is_zero`: `ctrlr_loss_timeout_sec` is 0 (no
/// reconnecting, so SPDK lets `reconnect_delay_sec` be 0).
fn spdk_reconnect_param(k: &str, v: &Value, loss_is_zero: bool) -> Result<Option<String>, String> {
    let (key, min) = match k {
        "ctrlr_loss_timeout_sec" => ("ctrl_loss_tmo", -1),
        "reconnect_delay_sec" => ("reconnect_delay", 0),
        "fast_io_fail_timeout_sec" => ("fast_io_fail_tmo", 0),
        _ => return Ok(None),
    };
    let n = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(x) => x.parse().ok(),
        _ => None,
    };
    let n = match n {
        Some(n) if n >= min && n <= 86400 * 365 => n,
        _ => {
            return Err(format!(
                "parameter '{k}': expected a number of seconds{}, got {v}",
                if min < 0 { " (-1: forever)" } else { "" }
            ))
        }
    };
    Ok(match (key, n) {
        // SPDK: no reconnect, so no delay between attempts.
        ("reconnect_delay", 0) if loss_is_zero => None,
        ("reconnect_delay", 0) => {
            return Err(format!(
                "parameter '{k}': can't be 0 if ctrlr_loss_timeout_sec is not 0"
            ))
        }
        // SPDK's 0 is off, Linux's -1.
        ("fast_io_fail_tmo", 0) => Some(format!("{key}:-1")),
        _ => Some(format!("{key}:{n}")),
    })
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
            paths: Vec::new(),
        }
    }

    #[test]
    fn attach_parameters_become_a_trid() {
        let t = attach_trid(&att(
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
        let Trid::Soft(t) = t else { panic!("{t:?}") };
        assert_eq!((t.size, t.namespaces), (1048576, 2));
        assert_eq!(t.limits.mdts, Some(1));
        // SPDK's fabrics and protection parameters mean nothing to a
        // local controller: ignored.
        let t = attach_trid(&att(
            "PCIe",
            Some("0000:0a:00.0"),
            &[("prchk_reftag", false.into()), ("subnqn", "x".into())],
        ))
        .unwrap();
        assert_eq!(
            t,
            Trid::Pcie {
                traddr: "0000:0a:00.0".into()
            }
        );
        // For TCP they are the transport ID's keys.
        let t = attach_trid(&att(
            "TCP",
            Some("127.0.0.1"),
            &[
                ("trsvcid", "4420".into()),
                ("subnqn", "nqn.2024-01.io.pollux:x".into()),
                ("ddgst", true.into()),
                ("multipath", "disable".into()),
            ],
        ))
        .unwrap();
        let Trid::Tcp(t) = t else { panic!("{t:?}") };
        assert!(t.ddgst && !t.hdgst && t.trsvcid == 4420);
        // Linux's reconnect defaults unless SPDK's parameters say otherwise
        // (SPDK's fast_io_fail_timeout_sec 0 is off: Linux's -1).
        assert_eq!(
            (t.ctrl_loss_tmo, t.reconnect_delay, t.fast_io_fail_tmo),
            (600, 10, -1)
        );
        let tcp = |p: &[(&str, Value)]| attach_trid(&att("tcp", Some("127.0.0.1"), p));
        let t = tcp(&[
            ("ctrlr_loss_timeout_sec", (-1).into()),
            ("reconnect_delay_sec", 2.into()),
            ("fast_io_fail_timeout_sec", 5.into()),
        ])
        .unwrap();
        let Trid::Tcp(t) = t else { panic!("{t:?}") };
        assert_eq!(
            (t.ctrl_loss_tmo, t.reconnect_delay, t.fast_io_fail_tmo),
            (-1, 2, 5)
        );
        let t = tcp(&[
            ("ctrlr_loss_timeout_sec", 0.into()),
            ("reconnect_delay_sec", 0.into()),
            ("fast_io_fail_timeout_sec", 0.into()),
        ])
        .unwrap();
        let Trid::Tcp(t) = t else { panic!("{t:?}") };
        assert_eq!((t.ctrl_loss_tmo, t.fast_io_fail_tmo), (0, -1));
        for (p, want) in [
            (
                ("ctrlr_loss_timeout_sec", (-2).into()),
                "ctrlr_loss_timeout_sec",
            ),
            (("reconnect_delay_sec", 0.into()), "reconnect_delay_sec"),
            (
                ("fast_io_fail_timeout_sec", "soon".into()),
                "fast_io_fail_timeout_sec",
            ),
        ] {
            let msg = tcp(&[p]).unwrap_err().to_string();
            assert!(msg.contains("'Nvme0'") && msg.contains(want), "{msg}");
        }
        for (a, want) in [
            (att("rdma", Some("1.2.3.4"), &[]), "rdma"),
            (att("pcie", None, &[]), "traddr"),
            (att("pcie", Some("x"), &[("colour", 1.into())]), "colour"),
            (att("soft", None, &[("colour", "blue".into())]), "colour"),
            (att("soft", None, &[("path", "a b".into())]), "white space"),
            (att("soft", Some("x"), &[]), "traddr"),
        ] {
            let msg = attach_trid(&a).unwrap_err().to_string();
            assert!(msg.contains("'Nvme0'") && msg.contains(want), "{msg}");
        }
    }
}
