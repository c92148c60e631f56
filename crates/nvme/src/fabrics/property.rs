//! The controller's registers over fabrics: Property Get and Property Set
//! commands and their answers, and what a register reads while there is
//! no association.
use pollux_spec::fabrics::{property_value, PropertyGetCmd, PropertySetCmd, PropertySize};
use pollux_spec::regs::{self, Csts};
use pollux_spec::{Cqe, Sqe};

use crate::error::{Error, Result};

/// Property Get of the register at `off`.
pub(crate) fn get(off: usize, size: PropertySize) -> Sqe {
    PropertyGetCmd::new(off as u32, size).to_sqe()
}

/// Property Set of the register at `off` to `v`.
pub(crate) fn set(off: usize, size: PropertySize, v: u64) -> Sqe {
    PropertySetCmd::new(off as u32, size, v).to_sqe()
}

/// The value a Property Get answered, or its error.
pub(crate) fn got(cqe: &Cqe, size: PropertySize) -> Result<u64> {
    let s = cqe.status();
    if !s.is_success() {
        return Err(Error::Nvme {
            cmd: "Property Get",
            status: s,
        });
    }
    Ok(property_value(cqe, size))
}

/// A Property Set's answer.
pub(crate) fn set_done(cqe: &Cqe) -> Result<()> {
    let s = cqe.status();
    if !s.is_success() {
        return Err(Error::Nvme {
            cmd: "Property Set",
            status: s,
        });
    }
    Ok(())
}

/// A register of a link that is down: CSTS fatal if it was lost (0 if
/// the host closed it: `torn_down`), all else 0.
pub(crate) fn down_value(off: usize, torn_down: bool) -> u64 {
    match off {
        regs::off::CSTS if !torn_down => Csts::CFS as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_spec::status::{generic, Status};

    fn cqe(status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            status: status.0 << 1,
            ..Cqe::default()
        }
    }

    #[test]
    fn get_reads_four_or_eight_bytes_and_names_a_failure() {
        let c = cqe(Status::SUCCESS, 0x1234_5678, 0x9abc_def0);
        assert_eq!(got(&c, PropertySize::Four).unwrap(), 0x1234_5678);
        assert_eq!(got(&c, PropertySize::Eight).unwrap(), 0x9abc_def0_1234_5678);
        let bad = cqe(Status::generic(generic::INVALID_FIELD), 0, 0);
        let e = got(&bad, PropertySize::Four).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Nvme {
                    cmd: "Property Get",
                    ..
                }
            ),
            "{e}"
        );
        assert!(matches!(
            set_done(&bad).unwrap_err(),
            Error::Nvme {
                cmd: "Property Set",
                ..
            }
        ));
        set_done(&c).unwrap();
    }

    #[test]
    fn commands_name_the_register() {
        let g = get(regs::off::CSTS, PropertySize::Four);
        let s = set(regs::off::CC, PropertySize::Four, 0x46_0001);
        assert_eq!(g.opc, pollux_spec::fabrics::FABRICS_OPCODE);
        assert_eq!(s.opc, pollux_spec::fabrics::FABRICS_OPCODE);
        assert_eq!(g.cdw11, regs::off::CSTS as u32);
        assert_eq!(s.cdw11, regs::off::CC as u32);
        assert_eq!(s.cdw12, 0x46_0001);
    }

    #[test]
    fn a_lost_link_reads_fatal_a_closed_one_disabled() {
        assert_eq!(down_value(regs::off::CSTS, false), Csts::CFS as u64);
        assert_eq!(down_value(regs::off::CSTS, true), 0);
        assert_eq!(down_value(regs::off::CC, false), 0);
        assert_eq!(down_value(regs::off::VS, true), 0);
    }
}
