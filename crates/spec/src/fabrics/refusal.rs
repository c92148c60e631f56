//! A refused Connect decoded by the command: its command-specific status
//! codes (SCT 1, 80h..91h) mean something else for Connect than for the
//! NVM command set's I/O commands (where 82h is "Attempted Write to Read
//! Only Range"), and Connect Invalid Parameters locates the field at fault
//! in DW0 (IATTR, IPO).

use super::cmd::{connect_ipo, fabrics_sc, ParamIn};
use crate::status::{sct, Status};

/// Why a controller refused a Connect (NVMe over Fabrics, Connect
/// response status values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectRefusal {
    /// 80h: the record format (RECFMT) is not supported.
    IncompatibleFormat,
    /// 81h: the controller is busy (no controller or queue for now).
    ControllerBusy,
    /// 82h: a parameter is invalid, located by IATTR/IPO in DW0.
    InvalidParameters(ConnectField),
    /// 83h: the host should restart discovery.
    RestartDiscovery,
    /// 84h: the host may not connect to the subsystem.
    InvalidHost,
    /// 85h: the queue type (an I/O queue of a discovery controller) is
    /// not supported.
    InvalidQueueType,
    /// 91h: in-band authentication is required.
    AuthenticationRequired,
}

/// The field a Connect Invalid Parameters response points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectField {
    /// In the command: Record Format.
    Recfmt,
    /// In the command: Queue ID.
    Qid,
    /// In the command: Submission Queue Size.
    Sqsize,
    /// In the command: Connect Attributes.
    Cattr,
    /// In the command: Keep Alive Timeout.
    Kato,
    /// In the data: Host Identifier.
    HostId,
    /// In the data: Controller ID.
    Cntlid,
    /// In the data: NVM Subsystem NQN.
    Subnqn,
    /// In the data: Host NQN.
    Hostnqn,
    /// Another offset, or a reserved IATTR (`iattr` None).
    Other { iattr: Option<ParamIn>, ipo: u16 },
}

impl ConnectField {
    /// The field at `ipo` of the command (IATTR 0) or data (IATTR 1);
    /// a reserved IATTR is kept as `Other`.
    pub const fn from_dw0(dw0: u32) -> Self {
        let ipo = dw0 as u16;
        let iattr = match (dw0 >> 16) as u8 {
            0 => ParamIn::Command,
            1 => ParamIn::Data,
            _ => return ConnectField::Other { iattr: None, ipo },
        };
        match (iattr, ipo) {
            (ParamIn::Command, connect_ipo::RECFMT) => ConnectField::Recfmt,
            (ParamIn::Command, connect_ipo::QID) => ConnectField::Qid,
            (ParamIn::Command, connect_ipo::SQSIZE) => ConnectField::Sqsize,
            (ParamIn::Command, connect_ipo::CATTR) => ConnectField::Cattr,
            (ParamIn::Command, connect_ipo::KATO) => ConnectField::Kato,
            (ParamIn::Data, connect_ipo::DATA_HOSTID) => ConnectField::HostId,
            (ParamIn::Data, connect_ipo::DATA_CNTLID) => ConnectField::Cntlid,
            (ParamIn::Data, connect_ipo::DATA_SUBNQN) => ConnectField::Subnqn,
            (ParamIn::Data, connect_ipo::DATA_HOSTNQN) => ConnectField::Hostnqn,
            (iattr, ipo) => ConnectField::Other {
                iattr: Some(iattr),
                ipo,
            },
        }
    }
}

impl core::fmt::Display for ConnectField {
    /// The field's name and where it is: "SUBNQN in the Connect data".
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (name, data) = match self {
            ConnectField::Recfmt => ("RECFMT", false),
            ConnectField::Qid => ("QID", false),
            ConnectField::Sqsize => ("SQSIZE", false),
            ConnectField::Cattr => ("CATTR", false),
            ConnectField::Kato => ("KATO", false),
            ConnectField::HostId => ("HOSTID", true),
            ConnectField::Cntlid => ("CNTLID", true),
            ConnectField::Subnqn => ("SUBNQN", true),
            ConnectField::Hostnqn => ("HOSTNQN", true),
            ConnectField::Other { iattr, ipo } => {
                return match iattr {
                    Some(ParamIn::Command) => write!(f, "byte {ipo} of the Connect command"),
                    Some(ParamIn::Data) => write!(f, "byte {ipo} of the Connect data"),
                    None => write!(f, "byte {ipo} (reserved IATTR)"),
                };
            }
        };
        let at = if data { "data" } else { "command" };
        write!(f, "{name} in the Connect {at}")
    }
}

impl ConnectRefusal {
    /// The refusal a Connect completed with `status` and `dw0` means, or
    /// `None` for a status that is not Connect specific (a generic one,
    /// or success).
    pub const fn decode(status: Status, dw0: u32) -> Option<Self> {
        if status.sct() != sct::COMMAND_SPECIFIC {
            return None;
        }
        Some(match status.sc() {
            fabrics_sc::INCOMPATIBLE_FORMAT => ConnectRefusal::IncompatibleFormat,
            fabrics_sc::CONTROLLER_BUSY => ConnectRefusal::ControllerBusy,
            fabrics_sc::CONNECT_INVALID_PARAMETERS => {
                ConnectRefusal::InvalidParameters(ConnectField::from_dw0(dw0))
            }
            fabrics_sc::CONNECT_RESTART_DISCOVERY => ConnectRefusal::RestartDiscovery,
            fabrics_sc::CONNECT_INVALID_HOST => ConnectRefusal::InvalidHost,
            fabrics_sc::INVALID_QUEUE_TYPE => ConnectRefusal::InvalidQueueType,
            fabrics_sc::AUTHENTICATION_REQUIRED => ConnectRefusal::AuthenticationRequired,
            _ => return None,
        })
    }

    /// The specification's name of the status.
    pub const fn name(&self) -> &'static str {
        match self {
            ConnectRefusal::IncompatibleFormat => "Connect Incompatible Format",
            ConnectRefusal::ControllerBusy => "Connect Controller Busy",
            ConnectRefusal::InvalidParameters(_) => "Connect Invalid Parameters",
            ConnectRefusal::RestartDiscovery => "Connect Restart Discovery",
            ConnectRefusal::InvalidHost => "Connect Invalid Host",
            ConnectRefusal::InvalidQueueType => "Connect Invalid Queue Type",
            ConnectRefusal::AuthenticationRequired => "Authentication Required",
        }
    }
}

/// A Connect's status for experts: its name read as a Connect status,
/// the raw SCT/SC/DNR, and the field at fault for Connect Invalid
/// Parameters: "Connect Invalid Parameters: SUBNQN in the Connect data
/// (sct 0x1, sc 0x82, dnr)".
pub struct ConnectStatus {
    pub status: Status,
    pub dw0: u32,
}

impl core::fmt::Display for ConnectStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let st = self.status;
        match ConnectRefusal::decode(st, self.dw0) {
            Some(r @ ConnectRefusal::InvalidParameters(field)) => {
                write!(f, "{}: {field} (", r.name())?
            }
            Some(r) => write!(f, "{} (", r.name())?,
            None => return write!(f, "{st}"),
        }
        write!(f, "sct {:#x}, sc {:#04x}", st.sct(), st.sc())?;
        if st.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabrics::{fabrics_status, ConnectResponse};

    #[test]
    fn connect_statuses_are_read_as_connect_statuses() {
        let st = |sc| fabrics_status(sc);
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 0x1_0100),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Subnqn))
        );
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 0x1_0200),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Hostnqn))
        );
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 0x1_0010),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Cntlid))
        );
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 44),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Sqsize))
        );
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 42),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Qid))
        );
        assert_eq!(
            ConnectRefusal::decode(st(0x82), 0x2_0100),
            Some(ConnectRefusal::InvalidParameters(ConnectField::Other {
                iattr: None,
                ipo: 256
            }))
        );
        for (sc, r) in [
            (0x80, ConnectRefusal::IncompatibleFormat),
            (0x81, ConnectRefusal::ControllerBusy),
            (0x83, ConnectRefusal::RestartDiscovery),
            (0x84, ConnectRefusal::InvalidHost),
            (0x85, ConnectRefusal::InvalidQueueType),
            (0x91, ConnectRefusal::AuthenticationRequired),
        ] {
            assert_eq!(ConnectRefusal::decode(st(sc), 0), Some(r), "{sc:#x}");
        }
        // Not Connect specific: generic statuses, success, SCT 1 codes
        // Connect does not define.
        assert_eq!(ConnectRefusal::decode(Status::generic(0x02), 0), None);
        assert_eq!(ConnectRefusal::decode(Status::SUCCESS, 5), None);
        assert_eq!(ConnectRefusal::decode(st(0x86), 0), None);
    }

    /// The fields the target's ConnectResponse points at read back.
    #[test]
    fn invalid_parameter_dw0_round_trips() {
        for (iattr, ipo, field) in [
            (
                ParamIn::Data,
                connect_ipo::DATA_SUBNQN,
                ConnectField::Subnqn,
            ),
            (
                ParamIn::Data,
                connect_ipo::DATA_HOSTNQN,
                ConnectField::Hostnqn,
            ),
            (
                ParamIn::Data,
                connect_ipo::DATA_CNTLID,
                ConnectField::Cntlid,
            ),
            (
                ParamIn::Data,
                connect_ipo::DATA_HOSTID,
                ConnectField::HostId,
            ),
            (ParamIn::Command, connect_ipo::SQSIZE, ConnectField::Sqsize),
            (ParamIn::Command, connect_ipo::QID, ConnectField::Qid),
            (ParamIn::Command, connect_ipo::CATTR, ConnectField::Cattr),
            (ParamIn::Command, connect_ipo::KATO, ConnectField::Kato),
            (ParamIn::Command, connect_ipo::RECFMT, ConnectField::Recfmt),
        ] {
            let dw0 = ConnectResponse::InvalidParam { iattr, ipo }.dw0();
            assert_eq!(ConnectField::from_dw0(dw0), field);
        }
    }

    #[test]
    fn the_expert_tail_names_the_connect_status_and_keeps_the_raw_one() {
        let s = ConnectStatus {
            status: fabrics_status(0x82),
            dw0: 0x1_0100,
        };
        assert_eq!(
            s.to_string(),
            "Connect Invalid Parameters: SUBNQN in the Connect data (sct 0x1, sc 0x82, dnr)"
        );
        let s = ConnectStatus {
            status: fabrics_status(0x84),
            dw0: 0,
        };
        assert_eq!(
            s.to_string(),
            "Connect Invalid Host (sct 0x1, sc 0x84, dnr)"
        );
        // Before, 82h read as the NVM command set's I/O status.
        assert!(!s.to_string().contains("Read Only"));
        let s = ConnectStatus {
            status: Status::generic(0x0C),
            dw0: 0,
        };
        assert_eq!(
            s.to_string(),
            "Command Sequence Error (sct 0x0, sc 0x0c, dnr)"
        );
    }
}
