//! Which namespace a path exposes: its subsystem NQN and the namespace's
//! identifiers, read from the controller, and the comparison that decides
//! whether two paths lead to the same namespace.
use pollux_nvme::{IoBuf, Namespace};
use pollux_spec::cmd::cns;
use pollux_spec::identify::{parse_ns_descriptors, IdentifyNamespace, NsDescriptor};
use pollux_spec::Sqe;
use zerocopy::FromBytes;

use crate::ctrl::Controller;

/// What identifies the namespace behind one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NsIdentity {
    pub subnqn: String,
    pub nsid: u32,
    pub nguid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
    pub uuid: Option<[u8; 16]>,
    /// ANA group ID (0: none reported).
    pub anagrpid: u32,
    pub lba_shift: u8,
    pub nsze: u64,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn nonzero<const N: usize>(b: [u8; N]) -> Option<[u8; N]> {
    b.iter().any(|&x| x != 0).then_some(b)
}

/// An Identify command's 4 KiB into a vector, or why not.
fn identify(ctrl: &Controller, cns: u8, nsid: u32) -> Result<Vec<u8>, String> {
    let buf = IoBuf::new(ctrl.alloc_dma(4096).map_err(|e| e.to_string())?).truncate(4096);
    let (cqe, buf) = ctrl
        .admin(Sqe::identify(cns, nsid, 0), Some(buf))
        .map_err(|e| e.to_string())?;
    let st = cqe.status();
    if !st.is_success() {
        return Err(format!("Identify (CNS {cns}) failed: {st}"));
    }
    buf.map(|b| b.as_slice().to_vec())
        .ok_or_else(|| "Identify returned no data".into())
}

impl NsIdentity {
    /// Reads the identity of namespace `ns` of `ctrl`.
    pub fn read(ctrl: &Controller, ns: &Namespace) -> Result<NsIdentity, String> {
        let nsid = ns.nsid();
        let raw = identify(ctrl, cns::NAMESPACE, nsid)?;
        let id = IdentifyNamespace::read_from_prefix(&raw)
            .map_err(|_| "Identify Namespace: short data".to_string())?
            .0;
        let mut me = NsIdentity {
            subnqn: ctrl.identify().subnqn_str().into_owned(),
            nsid,
            nguid: nonzero(id.nguid),
            eui64: nonzero(id.eui64),
            uuid: None,
            anagrpid: id.anagrpid,
            lba_shift: ns.lba_shift(),
            nsze: ns.nsze(),
        };
        // The descriptor list (NVMe 1.3): a controller without it still
        // has NGUID/EUI-64 in Identify Namespace.
        match identify(ctrl, cns::NS_DESCRIPTORS, nsid).map(|b| parse_ns_descriptors(&b)) {
            Ok(Ok(list)) => {
                for d in list {
                    match d {
                        NsDescriptor::Uuid(u) => me.uuid = nonzero(u),
                        NsDescriptor::Nguid(g) if me.nguid.is_none() => me.nguid = nonzero(g),
                        NsDescriptor::Eui64(e) if me.eui64.is_none() => me.eui64 = nonzero(e),
                        _ => {}
                    }
                }
            }
            Ok(Err(e)) => tracing::debug!("namespace descriptor list: {e:?}"),
            Err(e) => tracing::debug!("namespace descriptor list: {e}"),
        }
        Ok(me)
    }

    /// True when the namespace has an identifier that tells it apart.
    pub fn has_identifier(&self) -> bool {
        self.nguid.is_some() || self.eui64.is_some() || self.uuid.is_some()
    }

    /// How `other` differs from this one (None: the same namespace).
    pub fn mismatch(&self, other: &NsIdentity) -> Option<String> {
        if self.subnqn != other.subnqn {
            return Some(format!(
                "subsystem NQN '{}', not '{}'",
                other.subnqn, self.subnqn
            ));
        }
        fn differ<const N: usize>(
            what: &str,
            a: Option<[u8; N]>,
            b: Option<[u8; N]>,
        ) -> Option<String> {
            let show = |x: Option<[u8; N]>| x.map_or("none".to_string(), |v| hex(&v));
            (a != b).then(|| format!("{what} {}, not {}", show(b), show(a)))
        }
        differ("NGUID", self.nguid, other.nguid)
            .or_else(|| differ("EUI-64", self.eui64, other.eui64))
            .or_else(|| differ("UUID", self.uuid, other.uuid))
            .or_else(|| {
                (self.lba_shift != other.lba_shift || self.nsze != other.nsze).then(|| {
                    format!(
                        "{} blocks of {} bytes, not {} of {}",
                        other.nsze,
                        1u64 << other.lba_shift,
                        self.nsze,
                        1u64 << self.lba_shift
                    )
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> NsIdentity {
        NsIdentity {
            subnqn: "nqn.2024-01.io.pollux:a".into(),
            nsid: 1,
            nguid: Some([1; 16]),
            eui64: Some([2; 8]),
            uuid: Some([3; 16]),
            anagrpid: 1,
            lba_shift: 9,
            nsze: 100,
        }
    }

    #[test]
    fn same_namespace_matches_whatever_the_ana_group() {
        let mut b = id();
        b.anagrpid = 2;
        assert_eq!(id().mismatch(&b), None);
    }

    #[test]
    fn each_difference_is_named() {
        type Change = fn(&mut NsIdentity);
        let cases: [(Change, &str); 5] = [
            (
                |b| b.subnqn = "nqn.2024-01.io.pollux:b".into(),
                "subsystem NQN",
            ),
            (|b| b.nguid = Some([9; 16]), "NGUID"),
            (|b| b.eui64 = None, "EUI-64"),
            (|b| b.uuid = Some([9; 16]), "UUID"),
            (|b| b.nsze = 99, "blocks"),
        ];
        for (f, what) in cases {
            let mut b = id();
            f(&mut b);
            let m = id().mismatch(&b).expect("a mismatch");
            assert!(m.contains(what), "{m}");
        }
    }
}
