//! Identify: controller (CNS 01h), namespace (00h), active namespace list
//! (02h) and namespace identification descriptors (03h).
//!
//! Namespace identifiers (EUI-64, NGUID, UUID) are derived deterministically
//! from the serial number and NSID, so the same configuration always
//! presents the same identities (and a file-backed namespace keeps its
//! identity across device instances). All NSIDs 1..=NN are active.
use pollux_spec::cmd::cns;
use pollux_spec::identify::{
    write_ns_descriptors, IdentifyController, IdentifyNamespace, LbaFormat, NsDescriptor, NsIdList,
    CNTRLTYPE_IO, CSI_NVM, DLFEAT_READ_ZEROES, DLFEAT_WRITE_ZEROES_DEALLOC, IDENTIFY_DATA_SIZE,
    LPA_EXTENDED_DATA, OACS_DBBUF_CONFIG, ONCS_DSM, ONCS_SAVE_SELECT, ONCS_WRITE_ZEROES,
    VWC_FLUSH_BROADCAST_SUPPORTED, VWC_PRESENT,
};
use pollux_spec::regs::Vs;
use pollux_spec::status::generic;
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

use super::{gen, ok, AdminResult};
use crate::admin::features::{COMPOSITE_TEMP, DEFAULT_TEMP_OVER};
use crate::ctrl::Controller;
use pollux_controller::errlog::ERROR_LOG_ENTRIES;

/// PCI vendor ID reported (Red Hat / QEMU's, as emulated devices use).
pub const VID: u16 = 0x1b36;
/// PCI subsystem vendor ID reported.
pub const SSVID: u16 = 0x1af4;
/// Controller ID reported.
pub const CNTLID: u16 = 1;

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
                None => return gen(generic::INVALID_NAMESPACE),
            },
            cns::ACTIVE_NS_LIST => {
                if nsid >= 0xFFFF_FFFE {
                    return gen(generic::INVALID_NAMESPACE);
                }
                let n = self.ns.len() as u32;
                let list =
                    NsIdList::from_ids((nsid.saturating_add(1)..=n).take(NsIdList::CAPACITY));
                data.copy_from_slice(list.as_bytes());
            }
            cns::NS_DESCRIPTORS => {
                if !self.nsid_valid(nsid) {
                    return gen(generic::INVALID_NAMESPACE);
                }
                let (eui, nguid, uuid) = ns_ids(&self.cfg.serial, nsid);
                let list = [
                    NsDescriptor::Eui64(eui),
                    NsDescriptor::Nguid(nguid),
                    NsDescriptor::Uuid(uuid),
                    NsDescriptor::Csi(CSI_NVM),
                ];
                write_ns_descriptors(&list, &mut data);
            }
            _ => return gen(generic::INVALID_FIELD),
        }
        match self.xfer_to_host(sqe, IDENTIFY_DATA_SIZE, &data) {
            Ok(()) => ok(0),
            Err(s) => Some((0, s)),
        }
    }

    fn nsid_valid(&self, nsid: u32) -> bool {
        nsid >= 1 && nsid as usize <= self.ns.len()
    }

    pub(crate) fn identify_controller(&self) -> IdentifyController {
        let cfg = &self.cfg;
        let mut id = IdentifyController {
            vid: VID,
            ssvid: SSVID,
            ..Default::default()
        };
        id.set_serial(&cfg.serial);
        id.set_model(&cfg.model);
        id.set_firmware_rev(&cfg.firmware);
        id.rab = 6;
        id.ieee = [0x00, 0x54, 0x52];
        id.mdts = cfg.mdts;
        id.cntlid = CNTLID;
        id.ver = Vs::NVME_2_0.0;
        id.cntrltype = CNTRLTYPE_IO;
        id.oacs = if cfg.shadow_doorbells {
            OACS_DBBUF_CONFIG
        } else {
            0
        };
        id.acl = cfg.abort_limit;
        id.aerl = cfg.aer_limit;
        // One firmware slot, slot 1 read-only.
        id.frmw = 1 | (1 << 1);
        id.lpa = LPA_EXTENDED_DATA;
        id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
        id.npss = 0;
        id.wctemp = DEFAULT_TEMP_OVER;
        id.cctemp = COMPOSITE_TEMP + 60;
        id.sqes = 0x66;
        id.cqes = 0x44;
        id.maxcmd = (cfg.mqes as u32 + 1).min(u16::MAX as u32) as u16;
        id.nn = self.ns.len() as u32;
        id.oncs = ONCS_DSM | ONCS_WRITE_ZEROES | ONCS_SAVE_SELECT;
        id.vwc = VWC_PRESENT | VWC_FLUSH_BROADCAST_SUPPORTED;
        id.set_subnqn(&format!("nqn.2024-01.io.pollux:softnvme:{}", cfg.serial));
        id.psd[0].mp = 2500; // 25 W
        id
    }

    pub(crate) fn identify_namespace(&self, nsid: u32) -> Option<IdentifyNamespace> {
        if !self.nsid_valid(nsid) {
            return None;
        }
        let ns = &self.ns[nsid as usize - 1];
        let mut id = IdentifyNamespace {
            nsze: ns.nsze,
            ncap: ns.nsze,
            nuse: ns.nsze,
            nlbaf: 1,
            ..Default::default()
        };
        id.lbaf[0] = LbaFormat::new(0, 9, 0);
        id.lbaf[1] = LbaFormat::new(0, 12, 0);
        id.set_lba_format_index(if ns.lba_shift == 12 { 1 } else { 0 });
        id.dlfeat = DLFEAT_READ_ZEROES | DLFEAT_WRITE_ZEROES_DEALLOC;
        let (eui, nguid, _) = ns_ids(&self.cfg.serial, nsid);
        id.eui64 = eui;
        id.nguid = nguid;
        Some(id)
    }
}
