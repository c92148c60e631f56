//! Get Log Page: Error Information (01h), SMART / Health Information
//! (02h), Firmware Slot Information (03h), Changed Namespace List (04h),
//! Commands Supported and Effects (05h) and, with ANA reporting,
//! Asymmetric Namespace Access (0Ch: the groups of the active namespaces
//! with their states through this controller's port; LSP bit 0, RGO,
//! leaves out the NSID lists); anything else is Invalid Log Page.
//!
//! NUMD (NUMDL/NUMDU), the byte offset (LPOL/LPOU, dword aligned, not past
//! the end of the log) and RAE are honoured. The length NUMD asks for is
//! always transferred: past the end of the log, zeros (the spec leaves
//! those bytes undefined; Linux's nvmet sends zeros, and a transport that
//! sent fewer bytes would make its host see a short transfer). The index
//! offset type (OT) is not supported (Invalid Field).
use pollux_spec::cmd::NvmOpcode;
use pollux_spec::log::{
    data_units, effects, lid, AnaGroup, AnaLog, AnaState, CommandEffectsLog, FirmwareSlotLog,
    SmartLog, ANA_LSP_RGO,
};
use pollux_spec::status::{generic, specific};
use pollux_spec::AdminOpcode;
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

use super::{gen, spec, AdminResult, AfterKind};
use crate::ctrl::Controller;
use crate::features::COMPOSITE_TEMP;
use crate::subsystem::Personality;

/// Get Log Page CDW10 bit 15: Retain Asynchronous Event.
const RAE: u32 = 1 << 15;
/// Get Log Page CDW14 bit 23: offset type (index instead of bytes).
const OT: u32 = 1 << 23;

impl Controller {
    pub(crate) fn get_log_page(&self, sqe: &Sqe) -> AdminResult {
        let log_id = sqe.cdw10 as u8;
        let rae = sqe.cdw10 & RAE != 0;
        let numd = (sqe.cdw10 >> 16) as u64 | ((sqe.cdw11 & 0xFFFF) as u64) << 16;
        let len = ((numd + 1) * 4) as usize;
        let offset = sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32;
        if sqe.cdw14 & OT != 0 || !offset.is_multiple_of(4) {
            return gen(generic::INVALID_FIELD);
        }
        let page = match log_id {
            lid::ERROR => self.errlog.page(),
            lid::SMART => {
                if sqe.nsid != 0 && sqe.nsid != 0xFFFF_FFFF {
                    // LPA bit 0 clear: no per-namespace SMART.
                    return gen(generic::INVALID_FIELD);
                }
                self.smart_log().as_bytes().to_vec()
            }
            lid::FIRMWARE_SLOT => {
                let mut fw = FirmwareSlotLog::default();
                fw.set_afi(1, None);
                fw.set_revision(1, &self.subsys.identity().firmware);
                fw.as_bytes().to_vec()
            }
            // Cleared on read (RAE only keeps the event masked), as
            // Linux's nvmet does.
            lid::CHANGED_NS_LIST => self.ns_notice.take_page(),
            lid::COMMANDS_SUPPORTED => self.command_effects().as_bytes().to_vec(),
            lid::ANA if self.subsys.ana_reporting() => {
                let lsp = (sqe.cdw10 >> 8) as u8 & 0xF;
                self.ana_log().build(lsp & ANA_LSP_RGO != 0)
            }
            _ => return spec(specific::INVALID_LOG_PAGE),
        };
        if offset > page.len() as u64 {
            return gen(generic::INVALID_FIELD);
        }
        let start = offset as usize;
        let end = page.len().min(start.saturating_add(len));
        let mut page = page;
        page.truncate(end);
        page.drain(..start);
        let then = if rae {
            AfterKind::Nothing
        } else {
            AfterKind::LogRead(log_id)
        };
        self.send(page, len, then)
    }

    /// The ANA log page as this controller reports it: a group per ANA
    /// group of the active namespaces, in its state through the port the
    /// controller connected through (optimized without one).
    pub fn ana_log(&self) -> AnaLog {
        let port = self.ana_port.as_deref();
        AnaLog {
            chgcnt: port.map_or(0, |p| p.change_count()),
            groups: self
                .subsys
                .ana_groups()
                .into_iter()
                .map(|(anagrpid, nsids)| {
                    let (state, chgcnt) =
                        port.map_or((AnaState::Optimized, 0), |p| p.group(anagrpid));
                    AnaGroup {
                        anagrpid,
                        chgcnt,
                        state,
                        nsids,
                    }
                })
                .collect(),
        }
    }

    /// The Commands Supported and Effects log: the commands this
    /// controller executes in its personality. Writes, Write Zeroes and
    /// Dataset Management (deallocated blocks read as zeros) change
    /// logical block content.
    pub fn command_effects(&self) -> CommandEffectsLog {
        let mut l = CommandEffectsLog::default();
        use AdminOpcode::*;
        let mut admin = vec![
            GetLogPage,
            Identify,
            Abort,
            SetFeatures,
            GetFeatures,
            AsyncEventRequest,
        ];
        match self.subsys.personality() {
            Personality::Pcie(p) => {
                admin.extend([DeleteIoSq, CreateIoSq, DeleteIoCq, CreateIoCq]);
                if p.shadow_doorbells {
                    admin.push(DoorbellBufferConfig);
                }
            }
            Personality::Fabrics(f) => {
                if f.kas != 0 {
                    admin.push(KeepAlive);
                }
            }
        }
        for op in admin {
            l.acs[op as usize] = effects::CSUPP;
        }
        l.iocs[NvmOpcode::Flush as usize] = effects::CSUPP;
        l.iocs[NvmOpcode::Read as usize] = effects::CSUPP;
        for op in [
            NvmOpcode::Write,
            NvmOpcode::WriteZeroes,
            NvmOpcode::DatasetManagement,
        ] {
            l.iocs[op as usize] = effects::CSUPP | effects::LBCC;
        }
        l
    }

    /// The SMART / Health log: I/O counts of every queue as published,
    /// media errors and error log entries of this controller (with those
    /// its I/O queues reported and Get Log Page has not collected yet).
    pub fn smart_log(&self) -> SmartLog {
        let s = self.io_stats();
        let (errors, media) = self.io_stats.pending_errors();
        let mut log = SmartLog::default();
        log.set_temperature(COMPOSITE_TEMP);
        log.avail_spare = 100;
        log.spare_thresh = 10;
        log.percent_used = 0;
        log.set_data_units_read(data_units(s.bytes_read));
        log.set_data_units_written(data_units(s.bytes_written));
        log.set_host_read_commands(s.reads as u128);
        log.set_host_write_commands(s.writes as u128);
        log.set_power_cycles(1);
        log.set_power_on_hours((self.created.elapsed().as_secs() / 3600) as u128);
        log.set_media_errors((self.media_errors + media) as u128);
        log.set_num_err_log_entries((self.errlog.total() + errors) as u128);
        log
    }
}
