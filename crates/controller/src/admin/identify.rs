//! Identify: controller (CNS 01h), namespace (00h), active namespace list
//! (02h) and namespace identification descriptors (03h).
//!
//! Identify Controller reports the subsystem's personality: PCIe (what
//! the emulator always reported), or Fabrics (IOCCSZ/IORCSZ, ICDOFF 0,
//! FCATT 0 — the dynamic controller model —, MSDBD 1, SGLS, KAS, no
//! PCIe-only features).
//!
//! Namespace identifiers (EUI-64, NGUID, UUID) are derived deterministically
//! from the serial number and NSID, so the same configuration always
//! presents the same identities (and a file-backed namespace keeps its
//! identity across device instances). NN is the most namespaces
//! (`MAX_NAMESPACES`): namespaces are added and removed live; the active
//! list holds those that exist, and an inactive NSID's Identify Namespace
//! is zeros. OAES advertises Namespace Attribute Notices.
//!
//! Identifiers the configuration gives (`NsIds`) replace the derived
//! ones: a UUID or NGUID given alone is both (so two targets given the
//! same one report the same namespace), and the EUI-64 is then reported
//! only if given. A multipath subsystem reports CMIC multi-port and
//! multi-controller and its namespaces shared (NMIC bit 0); with ANA
//! reporting, CMIC bit 3, ANA Change notices, ANACAP (optimized,
//! non-optimized, inaccessible; ANAGRPID fixed while attached), ANATT
//! 10 s, ANAGRPMAX = NANAGRPID = MNAN = the most namespaces, and each
//! namespace's ANAGRPID (NUSE 0 while its group is inaccessible through
//! this controller's port, as SPDK reports).
use pollux_spec::cmd::cns;
use pollux_spec::identify::{
    write_ns_descriptors, IdentifyController, IdentifyNamespace, LbaFormat, NsDescriptor, NsIdList,
    ANACAP_GRPID_STATIC, ANACAP_INACCESSIBLE, ANACAP_NON_OPTIMIZED, ANACAP_OPTIMIZED, CMIC_ANA,
    CMIC_MULTI_CONTROLLER, CMIC_MULTI_PORT, CNTRLTYPE_IO, CSI_NVM, DLFEAT_READ_ZEROES,
    DLFEAT_WRITE_ZEROES_DEALLOC, IDENTIFY_DATA_SIZE, LPA_COMMANDS_EFFECTS, LPA_EXTENDED_DATA,
    OACS_DBBUF_CONFIG, OAES_ANA_CHANGE, OAES_NS_ATTR, ONCS_DSM, ONCS_SAVE_SELECT,
    ONCS_WRITE_ZEROES, VWC_FLUSH_BROADCAST_SUPPORTED, VWC_PRESENT,
};
use pollux_spec::log::AnaState;
use pollux_spec::regs::Vs;
use pollux_spec::status::generic;
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

use super::{gen, AdminResult, AfterKind};
use crate::ctrl::Controller;
use crate::errlog::ERROR_LOG_ENTRIES;
use crate::features::{COMPOSITE_TEMP, DEFAULT_TEMP_OVER};
use crate::subsystem::{Personality, MAX_NAMESPACES};

/// SGLS bit 0 (SGLs supported, no alignment requirement).
const SGLS_SUPPORTED: u32 = 1 << 0;
/// SGLS bit 20: the Offset address type of SGL Data Block descriptors.
/// (Bit 2, Keyed SGL Data Block — RDMA — is not set.)
const SGLS_OFFSET: u32 = 1 << 20;
/// SGLS bit 21: Transport SGL Data Block descriptor.
const SGLS_TRANSPORT_DATA_BLOCK: u32 = 1 << 21;
/// SGLS reported by a fabrics controller.
pub const FABRICS_SGLS: u32 = SGLS_SUPPORTED | SGLS_OFFSET | SGLS_TRANSPORT_DATA_BLOCK;

/// ANA Transition Time reported (seconds), SPDK's.
const ANATT_SECS: u8 = 10;

/// FNV-1a 64 over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Deterministic EUI-64, NGUID and UUID for namespace `nsid`.
pub fn ns_ids(serial: &str, nsid: u32) -> ([u8; 8], [u8; 16], [u8; 16]) {
    let base = fnv(0xcbf2_9ce4_8422_2325, serial.as_bytes());
    let h = |salt: u8| fnv(base, &[&nsid.to_le_bytes()[..], &[salt]].concat());
    let eui = h(1).to_be_bytes();
    let mut nguid = [0u8; 16];
    nguid[..8].copy_from_slice(&h(2).to_be_bytes());
    nguid[8..].copy_from_slice(&h(3).to_be_bytes());
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&h(4).to_be_bytes());
    uuid[8..].copy_from_slice(&h(5).to_be_bytes());
    uuid[6] = (uuid[6] & 0x0F) | 0x80; // RFC 9562 version 8 (custom)
    uuid[8] = (uuid[8] & 0x3F) | 0x80; // RFC variant
    (eui, nguid, uuid)
}

impl Controller {
    pub(crate) fn identify(&mut self, sqe: &Sqe) -> AdminResult {
        let cns_v = sqe.cdw10 as u8;
        let nsid = sqe.nsid;
        let mut data = vec![0u8; IDENTIFY_DATA_SIZE];
        match cns_v {
            cns::CONTROLLER => data.copy_from_slice(self.identify_controller().as_bytes()),
            cns::NAMESPACE => match self.identify_namespace(nsid) {
                Some(ns) => data.copy_from_slice(ns.as_bytes()),
                // An inactive NSID of the range: zeros.
                None if nsid != 0 && nsid as usize <= MAX_NAMESPACES => {}
                None => return gen(generic::INVALID_NAMESPACE),
            },
            cns::ACTIVE_NS_LIST => {
                if nsid >= 0xFFFF_FFFE {
                    return gen(generic::INVALID_NAMESPACE);
                }
                let active = self.subsys.namespaces();
                let list = NsIdList::from_ids(
                    active
                        .iter()
                        .map(|&(n, _)| n)
                        .filter(|&n| n > nsid)
                        .take(NsIdList::CAPACITY),
                );
                data.copy_from_slice(list.as_bytes());
            }
            cns::NS_DESCRIPTORS => {
                if !self.nsid_valid(nsid) {
                    return gen(generic::INVALID_NAMESPACE);
                }
                let (eui, nguid, uuid) = self.ns_identifiers(nsid);
                let mut list = Vec::with_capacity(4);
                if eui != [0; 8] {
                    list.push(NsDescriptor::Eui64(eui));
                }
                list.push(NsDescriptor::Nguid(nguid));
                list.push(NsDescriptor::Uuid(uuid));
                list.push(NsDescriptor::Csi(CSI_NVM));
                write_ns_descriptors(&list, &mut data);
            }
            _ => return gen(generic::INVALID_FIELD),
        }
        self.send(data, IDENTIFY_DATA_SIZE, AfterKind::Nothing)
    }

    /// EUI-64 (zeros: none), NGUID and UUID of namespace `nsid`: those
    /// the configuration gave, else derived (see the module doc).
    fn ns_identifiers(&self, nsid: u32) -> ([u8; 8], [u8; 16], [u8; 16]) {
        let derived = ns_ids(&self.subsys.identity().serial, nsid);
        let Some(ids) = self.subsys.namespace(nsid).map(|n| *n.ids()) else {
            return derived;
        };
        match (ids.nguid.or(ids.uuid), ids.uuid.or(ids.nguid)) {
            (Some(nguid), Some(uuid)) => (ids.eui64.unwrap_or([0; 8]), nguid, uuid),
            _ => (ids.eui64.unwrap_or(derived.0), derived.1, derived.2),
        }
    }

    fn nsid_valid(&self, nsid: u32) -> bool {
        self.subsys.namespace(nsid).is_some()
    }

    /// Identify Controller data of this controller.
    pub fn identify_controller(&self) -> IdentifyController {
        let ident = self.subsys.identity();
        let lim = self.subsys.limits();
        let mut id = IdentifyController {
            vid: ident.vid,
            ssvid: ident.ssvid,
            ..Default::default()
        };
        id.set_serial(&ident.serial);
        id.set_model(&ident.model);
        id.set_firmware_rev(&ident.firmware);
        id.rab = 6;
        id.ieee = ident.ieee;
        id.mdts = lim.mdts;
        id.cntlid = self.cntlid;
        id.ver = Vs::NVME_2_0.0;
        id.cntrltype = CNTRLTYPE_IO;
        id.acl = lim.abort_limit;
        id.aerl = lim.aer_limit;
        // One firmware slot, slot 1 read-only.
        id.frmw = 1 | (1 << 1);
        id.lpa = LPA_EXTENDED_DATA | LPA_COMMANDS_EFFECTS;
        id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
        id.npss = 0;
        id.wctemp = DEFAULT_TEMP_OVER;
        id.cctemp = COMPOSITE_TEMP + 60;
        id.sqes = 0x66;
        id.cqes = 0x44;
        id.maxcmd = (lim.mqes as u32 + 1).min(u16::MAX as u32) as u16;
        // Namespaces come and go: every NSID up to the most is valid.
        id.nn = MAX_NAMESPACES as u32;
        id.oaes = OAES_NS_ATTR;
        id.oncs = ONCS_DSM | ONCS_WRITE_ZEROES | ONCS_SAVE_SELECT;
        id.vwc = VWC_PRESENT | VWC_FLUSH_BROADCAST_SUPPORTED;
        id.set_subnqn(&ident.subnqn);
        id.psd[0].mp = 2500; // 25 W
        match self.subsys.personality() {
            Personality::Pcie(p) => {
                id.oacs = if p.shadow_doorbells {
                    OACS_DBBUF_CONFIG
                } else {
                    0
                };
            }
            Personality::Fabrics(f) => {
                // CMIC, ANA: see the module doc; OACS: no DBBC.
                if self.subsys.multipath() {
                    id.cmic = CMIC_MULTI_PORT | CMIC_MULTI_CONTROLLER;
                }
                if self.subsys.ana_reporting() {
                    id.cmic |= CMIC_ANA;
                    id.oaes |= OAES_ANA_CHANGE;
                    id.anatt = ANATT_SECS;
                    id.anacap = ANACAP_OPTIMIZED
                        | ANACAP_NON_OPTIMIZED
                        | ANACAP_INACCESSIBLE
                        | ANACAP_GRPID_STATIC;
                    id.anagrpmax = MAX_NAMESPACES as u32;
                    id.nanagrpid = MAX_NAMESPACES as u32;
                    id.mnan = MAX_NAMESPACES as u32;
                }
                id.kas = f.kas;
                id.sgls = FABRICS_SGLS;
                // In 16-byte units: the 64-byte SQE plus in-capsule data;
                // a response capsule is the 16-byte CQE.
                id.ioccsz = (64 + f.in_capsule_data) / 16;
                id.iorcsz = 1;
                id.icdoff = 0;
                id.fcatt = 0; // dynamic controller model
                id.msdbd = 1;
            }
        }
        id
    }

    /// Identify Namespace data of `nsid` (None: no such namespace).
    pub fn identify_namespace(&self, nsid: u32) -> Option<IdentifyNamespace> {
        let ns = self.subsys.namespace(nsid)?;
        let nsze = ns.nsze();
        let mut id = IdentifyNamespace {
            nsze,
            ncap: nsze,
            nuse: nsze,
            nlbaf: 1,
            ..Default::default()
        };
        id.lbaf[0] = LbaFormat::new(0, 9, 0);
        id.lbaf[1] = LbaFormat::new(0, 12, 0);
        id.set_lba_format_index(if ns.lba_shift() == 12 { 1 } else { 0 });
        id.dlfeat = DLFEAT_READ_ZEROES | DLFEAT_WRITE_ZEROES_DEALLOC;
        let (eui, nguid, _) = self.ns_identifiers(nsid);
        id.eui64 = eui;
        id.nguid = nguid;
        if self.subsys.multipath() {
            id.nmic = 1; // shared: may be reached through other controllers
        }
        if self.subsys.ana_reporting() {
            id.anagrpid = ns.anagrpid(nsid);
            if let Some(p) = &self.ana_port {
                if matches!(
                    p.state(id.anagrpid),
                    AnaState::Inaccessible | AnaState::PersistentLoss
                ) {
                    id.nuse = 0;
                }
            }
        }
        Some(id)
    }
}
