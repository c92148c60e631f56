//! A Connect the controller refused, told as what went wrong and what to
//! do, with the raw status kept at the end for experts.
use std::fmt;

use pollux_spec::fabrics::{ConnectField, ConnectRefusal, ConnectStatus};
use pollux_spec::Status;

/// A refused Connect: what the host asked for, and the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRefused {
    /// The controller's address (the transport's: `127.0.0.1:4420`).
    pub addr: String,
    pub subnqn: String,
    pub hostnqn: String,
    /// The queue (0: admin).
    pub qid: u16,
    /// Entries asked for the queue.
    pub sq_entries: u16,
    /// The controller ID in the Connect data (0xFFFF: any).
    pub cntlid: u16,
    pub cattr: u8,
    pub kato_ms: u32,
    pub status: Status,
    pub dw0: u32,
}

impl ConnectRefused {
    /// The refusal decoded by the command (None: not Connect specific).
    pub fn refusal(&self) -> Option<ConnectRefusal> {
        ConnectRefusal::decode(self.status, self.dw0)
    }
}

impl fmt::Display for ConnectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            addr,
            subnqn,
            hostnqn,
            qid,
            ..
        } = self;
        f.write_str("Connect refused: ")?;
        match self.refusal() {
            Some(ConnectRefusal::InvalidParameters(field)) => match field {
                ConnectField::Subnqn => write!(
                    f,
                    "subsystem {subnqn} is not served at {addr}; `pollux discover` lists what this host may reach"
                ),
                ConnectField::Hostnqn => write!(
                    f,
                    "host NQN {hostnqn} was refused as invalid by {addr} (give another with hostnqn:)"
                ),
                ConnectField::Cntlid if *qid == 0 => write!(
                    f,
                    "{addr} refused controller ID {:#06x} (any controller) for subsystem {subnqn}",
                    self.cntlid
                ),
                ConnectField::Cntlid => write!(
                    f,
                    "{addr} no longer knows controller {} of subsystem {subnqn} for this host (it was reset or timed out): I/O queue {qid} not connected",
                    self.cntlid
                ),
                ConnectField::Sqsize => write!(
                    f,
                    "{addr} refused {} entries for queue {qid}: it allows fewer (ask for a smaller queue)",
                    self.sq_entries
                ),
                ConnectField::Qid => write!(
                    f,
                    "{addr} refused queue ID {qid} (more I/O queues than the controller granted, or one already connected)"
                ),
                ConnectField::Cattr => write!(
                    f,
                    "{addr} refused the Connect attributes {:#04x} of queue {qid}",
                    self.cattr
                ),
                ConnectField::Kato => write!(
                    f,
                    "{addr} refused a keep-alive timeout of {} ms",
                    self.kato_ms
                ),
                ConnectField::HostId => write!(f, "{addr} refused this host's host ID"),
                ConnectField::Recfmt | ConnectField::Other { .. } => {
                    write!(f, "{addr} refused a parameter of the Connect ({field})")
                }
            },
            Some(ConnectRefusal::InvalidHost) => write!(
                f,
                "host {hostnqn} is not allowed by subsystem {subnqn} at {addr} (give an allowed host NQN with hostnqn:, or add this one to the target's hosts)"
            ),
            Some(ConnectRefusal::ControllerBusy) => write!(
                f,
                "{addr} is busy: it has no controller or connection left for subsystem {subnqn} now (see the target's log; try again later)"
            ),
            Some(ConnectRefusal::RestartDiscovery) => write!(
                f,
                "{addr} asks this host to restart discovery for subsystem {subnqn}; `pollux discover` lists where it is served now"
            ),
            Some(ConnectRefusal::InvalidQueueType) => write!(
                f,
                "subsystem {subnqn} at {addr} takes no I/O queues (a discovery subsystem?): queue {qid} not connected"
            ),
            Some(ConnectRefusal::IncompatibleFormat) => write!(
                f,
                "{addr} does not support the Connect record format 0"
            ),
            Some(ConnectRefusal::AuthenticationRequired) => write!(
                f,
                "subsystem {subnqn} at {addr} requires in-band authentication, which pollux does not support"
            ),
            None => write!(f, "{addr} refused queue {qid} of subsystem {subnqn}"),
        }?;
        write!(
            f,
            " [{}]",
            ConnectStatus {
                status: self.status,
                dw0: self.dw0
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_spec::fabrics::{fabrics_status, ConnectResponse, ParamIn};

    fn refused(sc: u8, dw0: u32) -> ConnectRefused {
        ConnectRefused {
            addr: "127.0.0.1:4420".into(),
            subnqn: "nqn.2016-06.io.pollux:nothere".into(),
            hostnqn: "nqn.2014-08.org.example:me".into(),
            qid: 0,
            sq_entries: 32,
            cntlid: 0xFFFF,
            cattr: 0,
            kato_ms: 10_000,
            status: fabrics_status(sc),
            dw0,
        }
    }

    #[test]
    fn an_unknown_subsystem_says_where_and_what_to_do() {
        let dw0 = ConnectResponse::InvalidParam {
            iattr: ParamIn::Data,
            ipo: 256,
        }
        .dw0();
        assert_eq!(
            refused(0x82, dw0).to_string(),
            "Connect refused: subsystem nqn.2016-06.io.pollux:nothere is not served at 127.0.0.1:4420; \
             `pollux discover` lists what this host may reach \
             [Connect Invalid Parameters: SUBNQN in the Connect data (sct 0x1, sc 0x82, dnr)]"
        );
    }

    #[test]
    fn a_host_not_allowed_is_named_with_its_subsystem() {
        let m = refused(0x84, 0).to_string();
        assert!(
            m.starts_with(
                "Connect refused: host nqn.2014-08.org.example:me is not allowed by subsystem nqn.2016-06.io.pollux:nothere at 127.0.0.1:4420"
            ),
            "{m}"
        );
        assert!(
            m.ends_with("[Connect Invalid Host (sct 0x1, sc 0x84, dnr)]"),
            "{m}"
        );
        // Linux's nvmet points IPO at HOSTNQN for 84h too: the same message.
        assert_eq!(
            refused(0x84, 0x1_0200).to_string().split(" [").next(),
            m.split(" [").next()
        );
    }

    #[test]
    fn every_connect_status_reads_as_a_connect_status() {
        let mut io = refused(0x82, 0x1_0010);
        io.qid = 2;
        io.cntlid = 7;
        let cases = [
            (refused(0x80, 0), "record format"),
            (refused(0x81, 0), "is busy"),
            (
                refused(0x82, 0x1_0200),
                "host NQN nqn.2014-08.org.example:me",
            ),
            (refused(0x82, 0x1_0010), "controller ID 0xffff"),
            (io, "no longer knows controller 7"),
            (refused(0x82, 44), "refused 32 entries for queue 0"),
            (refused(0x82, 42), "queue ID 0"),
            (refused(0x82, 48), "keep-alive timeout of 10000 ms"),
            (refused(0x82, 0x1_0300), "(byte 768 of the Connect data)"),
            (refused(0x83, 0), "restart discovery"),
            (refused(0x85, 0), "takes no I/O queues"),
            (refused(0x91, 0), "authentication"),
        ];
        for (r, want) in cases {
            let m = r.to_string();
            assert!(m.contains(want), "{m:?} lacks {want:?}");
            assert!(
                m.contains(&format!("sc {:#04x}", r.status.sc())),
                "raw status kept: {m}"
            );
            assert!(!m.contains("Read Only"), "{m}");
        }
        // A generic status keeps its generic name.
        let mut g = refused(0, 0);
        g.status = Status::generic(0x06);
        assert!(
            g.to_string()
                .contains("[Internal Error (sct 0x0, sc 0x06, dnr)]"),
            "{g}"
        );
    }
}
