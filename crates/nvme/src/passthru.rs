//! Passthrough commands (`Submitter::raw`, `Controller::admin`): what the
//! driver lets safe code send.
//!
//! The caller's command never chooses where the controller transfers
//! data: the data pointer fields (PRP1/PRP2 or the SGL, MPTR, PSDT) are
//! cleared here and filled by the transport from the buffer the request
//! owns (`clear_pointers`). And the buffer must be as long as the transfer
//! the command asks for: the safe entry points send only the commands
//! whose length the driver can read from the command itself (below), and
//! refuse any other buffer length. Everything else (vendor-specific
//! opcodes, commands that hand the controller host memory by address or
//! change the namespaces' geometry the I/O path relies on) goes through
//! the `unsafe fn`s (`raw_unchecked`, `raw_dma`, `admin_unchecked`),
//! whose callers vouch for the transfer.
//!
//! Lengths: NVMe 2.0 base spec (Get Log Page NUMD, Identify, Get/Set
//! Features data structures per FID, Firmware Image Download and
//! Directive NUMD, Security AL) and NVM command set spec 1.0 (Read,
//! Write, Compare NLB, Dataset Management NR, reservations, Copy).
use pollux_spec::cmd::{AdminOpcode, NvmOpcode};
use pollux_spec::features::{cdw10_fid, cdw10_sel, fid, sel};
use pollux_spec::Sqe;

use crate::error::SubmitError;
use crate::namespace::Namespace;

/// PSDT (flags bits 7:6): 0 = PRPs; a transport that uses SGLs sets it.
const PSDT_MASK: u8 = 0xC0;

/// Clears every field of a caller's command that names host memory: the
/// transport fills the data pointer from the request's own buffer, and
/// nothing else may point anywhere (pollux uses no separate metadata).
#[inline]
pub(crate) fn clear_pointers(sqe: &mut Sqe) {
    sqe.mptr = 0;
    sqe.prp1 = 0;
    sqe.prp2 = 0;
    sqe.flags &= !PSDT_MASK;
}

/// Why the driver cannot tell a command's transfer length.
type Unknown = &'static str;

/// The bytes `sqe` transfers, or why that is not known. `ns`: the
/// controller's active namespaces.
fn io_transfer(sqe: &Sqe, ns: &[Namespace]) -> Result<u64, Unknown> {
    let Some(op) = NvmOpcode::from_u8(sqe.opc) else {
        return Err(if sqe.opc >= 0x80 {
            "vendor-specific I/O command"
        } else {
            "I/O command whose transfer the driver does not know"
        });
    };
    let dwords = |numd: u32| (numd as u64 + 1) * 4;
    Ok(match op {
        NvmOpcode::Flush
        | NvmOpcode::WriteUncorrectable
        | NvmOpcode::WriteZeroes
        | NvmOpcode::Verify => 0,
        NvmOpcode::Read | NvmOpcode::Write | NvmOpcode::Compare => {
            let Some(n) = ns.iter().find(|n| n.nsid == sqe.nsid) else {
                return Err("its NSID is not an active namespace of this controller, \
                            so its block size (and transfer length) is unknown");
            };
            ((sqe.cdw12 & 0xFFFF) as u64 + 1) << n.lba_shift
        }
        NvmOpcode::DatasetManagement => ((sqe.cdw10 & 0xFF) as u64 + 1) * 16,
        NvmOpcode::ReservationRegister | NvmOpcode::ReservationAcquire => 16,
        NvmOpcode::ReservationRelease => 8,
        NvmOpcode::ReservationReport => dwords(sqe.cdw10),
        NvmOpcode::Copy => {
            let ranges = (sqe.cdw12 & 0xFF) as u64 + 1;
            match (sqe.cdw12 >> 8) & 0xF {
                0 => ranges * 32,
                1 => ranges * 40,
                _ => return Err("Copy with a descriptor format the driver does not know"),
            }
        }
    })
}

/// Data bytes of Get/Set Features for feature `f` (`set`: Set Features).
fn feature_transfer(f: u8, set: bool, cdw11: u32) -> Result<u64, Unknown> {
    Ok(match f {
        fid::ARBITRATION
        | fid::POWER_MANAGEMENT
        | fid::TEMPERATURE_THRESHOLD
        | fid::ERROR_RECOVERY
        | fid::VOLATILE_WRITE_CACHE
        | fid::NUMBER_OF_QUEUES
        | fid::INTERRUPT_COALESCING
        | fid::INTERRUPT_VECTOR_CONFIG
        | fid::WRITE_ATOMICITY
        | fid::ASYNC_EVENT_CONFIG
        | fid::KEEP_ALIVE
        | fid::HOST_CONTROLLED_THERMAL
        | fid::NON_OPERATIONAL_POWER_STATE
        | fid::READ_RECOVERY_LEVEL
        | fid::PREDICTABLE_LATENCY_WINDOW
        | fid::LBA_STATUS_INFO
        | fid::SANITIZE_CONFIG
        | fid::ENDURANCE_GROUP_EVENT_CONFIG
        | fid::IO_COMMAND_SET_PROFILE
        | fid::SPINUP_CONTROL
        | fid::SOFTWARE_PROGRESS_MARKER
        | fid::RESERVATION_NOTIFICATION_MASK
        | fid::RESERVATION_PERSISTENCE
        | fid::NAMESPACE_WRITE_PROTECTION => 0,
        // 64 LBA Range Type entries of 64 bytes.
        fid::LBA_RANGE_TYPE => 4096,
        // 32 power state transition entries of 8 bytes.
        fid::AUTONOMOUS_POWER_STATE => 256,
        fid::HOST_MEMORY_BUFFER if set => {
            return Err("Set Features Host Memory Buffer hands the controller \
                        host memory by address");
        }
        // The Host Memory Buffer Attributes data structure.
        fid::HOST_MEMORY_BUFFER => 4096,
        fid::TIMESTAMP => 8,
        fid::PREDICTABLE_LATENCY_CONFIG => 512,
        fid::HOST_BEHAVIOR_SUPPORT => 512,
        // EXHID (CDW11 bit 0): the 128-bit extended host identifier.
        fid::HOST_IDENTIFIER if cdw11 & 1 != 0 => 16,
        fid::HOST_IDENTIFIER => 8,
        _ => return Err("a feature whose data structure the driver does not know"),
    })
}

/// As `io_transfer`, for an admin command.
fn admin_transfer(sqe: &Sqe) -> Result<u64, Unknown> {
    let Some(op) = AdminOpcode::from_u8(sqe.opc) else {
        return Err(if sqe.opc >= 0xC0 {
            "vendor-specific admin command"
        } else {
            "admin command whose transfer the driver does not know"
        });
    };
    let dwords = |numd: u64| (numd + 1) * 4;
    use AdminOpcode as A;
    Ok(match op {
        A::GetLogPage => dwords((sqe.cdw10 >> 16) as u64 | ((sqe.cdw11 & 0xFFFF) as u64) << 16),
        A::Identify => 4096,
        A::GetFeatures if cdw10_sel(sqe.cdw10) == sel::SUPPORTED => 0,
        A::GetFeatures => feature_transfer(cdw10_fid(sqe.cdw10), false, sqe.cdw11)?,
        A::SetFeatures => feature_transfer(cdw10_fid(sqe.cdw10), true, sqe.cdw11)?,
        A::Abort
        | A::AsyncEventRequest
        | A::KeepAlive
        | A::DeviceSelfTest
        | A::FirmwareCommit
        | A::Sanitize => 0,
        A::FirmwareImageDownload | A::DirectiveSend | A::DirectiveReceive => {
            dwords(sqe.cdw10 as u64)
        }
        // AL: allocation/transfer length in bytes.
        A::SecuritySend | A::SecurityReceive => sqe.cdw11 as u64,
        A::CreateIoSq | A::CreateIoCq | A::DeleteIoSq | A::DeleteIoCq | A::DoorbellBufferConfig => {
            return Err("queue management belongs to the driver (its commands \
                        hand the controller host memory by address)");
        }
        A::FormatNvm | A::NamespaceManagement | A::NamespaceAttachment => {
            return Err("it changes the namespaces whose block size and size the \
                        I/O path relies on");
        }
        A::FabricsCommand => return Err("fabrics commands belong to the transport"),
        A::VirtualizationManagement | A::NvmeMiSend | A::NvmeMiReceive | A::GetLbaStatus => {
            return Err("admin command whose transfer the driver does not know");
        }
    })
}

fn check(opc: u8, admin: bool, t: Result<u64, Unknown>, got: usize) -> Result<(), SubmitError> {
    match t {
        Ok(expected) if expected == got as u64 => Ok(()),
        Ok(expected) => Err(SubmitError::PassthroughLength {
            opc,
            admin,
            expected,
            got,
        }),
        Err(why) => Err(SubmitError::PassthroughUnchecked { opc, admin, why }),
    }
}

/// Refuses an I/O command whose transfer is unknown, or is not `got`
/// bytes (the buffer's length; 0 without one).
pub(crate) fn check_io(sqe: &Sqe, got: usize, ns: &[Namespace]) -> Result<(), SubmitError> {
    check(sqe.opc, false, io_transfer(sqe, ns), got)
}

/// As `check_io`, for an admin command.
pub(crate) fn check_admin(sqe: &Sqe, got: usize) -> Result<(), SubmitError> {
    check(sqe.opc, true, admin_transfer(sqe), got)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: [Namespace; 2] = [
        Namespace {
            nsid: 1,
            lba_shift: 9,
            nsze: 1 << 20,
            max_lbas: 256,
            ctrl: 1,
        },
        Namespace {
            nsid: 2,
            lba_shift: 12,
            nsze: 1 << 20,
            max_lbas: 32,
            ctrl: 1,
        },
    ];

    fn io_len(sqe: Sqe) -> Result<u64, Unknown> {
        io_transfer(&sqe, &NS)
    }

    fn admin_len(sqe: Sqe) -> Result<u64, Unknown> {
        admin_transfer(&sqe)
    }

    #[test]
    fn io_lengths_follow_the_command_and_the_namespace() {
        assert_eq!(io_len(Sqe::rw(NvmOpcode::Read, 1, 0, 8)), Ok(4096));
        assert_eq!(io_len(Sqe::rw(NvmOpcode::Write, 2, 0, 8)), Ok(32768));
        assert_eq!(io_len(Sqe::rw(NvmOpcode::Compare, 2, 0, 1)), Ok(4096));
        assert_eq!(io_len(Sqe::flush(1)), Ok(0));
        assert_eq!(io_len(Sqe::write_zeroes(1, 0, 100, true)), Ok(0));
        assert_eq!(io_len(Sqe::dsm(1, 3, 0, 0)), Ok(48));
        let mut copy = Sqe::new(NvmOpcode::Copy as u8, 1);
        copy.cdw12 = 1 | 1 << 8; // two ranges, format 1
        assert_eq!(io_len(copy), Ok(80));
        copy.cdw12 = 1 | 2 << 8;
        assert!(io_len(copy).is_err());
        // A namespace the driver does not know, a vendor opcode.
        assert!(io_len(Sqe::rw(NvmOpcode::Read, 3, 0, 8)).is_err());
        assert!(io_len(Sqe::rw(NvmOpcode::Read, u32::MAX, 0, 8)).is_err());
        assert!(io_len(Sqe::new(0x81, 1)).is_err());
    }

    #[test]
    fn admin_lengths_follow_the_command() {
        assert_eq!(
            admin_len(Sqe::get_log_page(2, u32::MAX, 512, 0, 0, 0)),
            Ok(512)
        );
        // NUMDU: more than 64K dwords.
        assert_eq!(
            admin_len(Sqe::get_log_page(2, 0, 1 << 20, 0, 0, 0)),
            Ok(1 << 20)
        );
        assert_eq!(admin_len(Sqe::identify(1, 0, 0)), Ok(4096));
        assert_eq!(
            admin_len(Sqe::get_features(fid::NUMBER_OF_QUEUES, 0)),
            Ok(0)
        );
        assert_eq!(admin_len(Sqe::get_features(fid::TIMESTAMP, 0)), Ok(8));
        assert_eq!(
            admin_len(Sqe::get_features(fid::LBA_RANGE_TYPE, 1)),
            Ok(4096)
        );
        let mut supported = Sqe::get_features(fid::TIMESTAMP, 0);
        supported.cdw10 |= (sel::SUPPORTED as u32) << 8;
        assert_eq!(admin_len(supported), Ok(0));
        assert_eq!(
            admin_len(Sqe::set_features(fid::HOST_IDENTIFIER, 0, 1)),
            Ok(16)
        );
        assert_eq!(
            admin_len(Sqe::get_features(fid::HOST_MEMORY_BUFFER, 0)),
            Ok(4096)
        );
        assert!(admin_len(Sqe::set_features(fid::HOST_MEMORY_BUFFER, 0, 1)).is_err());
        assert!(admin_len(Sqe::get_features(0xC0, 0)).is_err());
        assert!(admin_len(Sqe::create_io_cq(1, 16, 0)).is_err());
        assert!(admin_len(Sqe::doorbell_buffer_config(0, 0)).is_err());
        assert!(admin_len(Sqe::new(AdminOpcode::FormatNvm as u8, 1)).is_err());
        assert!(admin_len(Sqe::new(0xC5, 0)).is_err());
    }

    #[test]
    fn the_callers_pointers_are_cleared() {
        let mut s = Sqe::identify(1, 0, 0xdead_b000);
        s.prp2 = 0xbeef_0000;
        s.mptr = 0x1000;
        s.flags = 0x40 | 1; // PSDT = SGL, FUSE = first
        clear_pointers(&mut s);
        assert_eq!((s.prp1, s.prp2, s.mptr, s.flags), (0, 0, 0, 1));
    }

    #[test]
    fn errors_name_the_command_and_the_lengths() {
        let e = check_io(&Sqe::rw(NvmOpcode::Read, 1, 0, 8), 512, &NS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Read (opcode 0x02) transfers 4096 bytes but the buffer is 512 bytes"
        );
        let e = check_admin(&Sqe::new(0xC5, 0), 0).unwrap_err();
        assert!(e.to_string().contains("0xc5"), "{e}");
        assert!(e.to_string().contains("vendor-specific"), "{e}");
        assert_eq!(check_io(&Sqe::flush(1), 0, &NS), Ok(()));
    }

    /// The submit path returns `Result<(), SubmitError>` per I/O: the
    /// passthrough variants keep it as small as it was (24 bytes).
    #[test]
    fn submit_error_stays_small() {
        assert!(std::mem::size_of::<SubmitError>() <= 24);
    }
}
