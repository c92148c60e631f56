//! TEMPORARY stand-in for `pollux-auth` (the DH-HMAC-CHAP core, written
//! on another branch): the same names, and no authentication at all —
//! no key can be loaded, so no host can be given one. Removed when the
//! core is merged.
use std::sync::Arc;

pub struct Secret(());

impl Secret {
    pub fn from_file_bytes(_: &[u8]) -> Result<Secret, String> {
        Err("DH-HMAC-CHAP is not built in yet (pollux-auth missing)".into())
    }
}

#[allow(dead_code)]
pub enum CtrlOutcome {
    Continue,
    Authenticated,
    Failed(String),
    Invalid(String),
}

pub struct CtrlAuth;

impl CtrlAuth {
    #[allow(clippy::too_many_arguments, dead_code)]
    pub fn new(
        _host: &str,
        _subnqn: &str,
        _qid: u16,
        _key: Arc<Secret>,
        _ctrl: Option<Arc<Secret>>,
        _digests: u8,
        _dhgroups: u8,
    ) -> CtrlAuth {
        CtrlAuth
    }
    pub fn is_negotiate(_msg: &[u8]) -> bool {
        false
    }
    pub fn on_send(&mut self, _msg: &[u8]) -> CtrlOutcome {
        CtrlOutcome::Invalid("no DH-HMAC-CHAP".into())
    }
    pub fn on_receive(&mut self, _al: usize) -> (Vec<u8>, CtrlOutcome) {
        (Vec::new(), CtrlOutcome::Failed("no DH-HMAC-CHAP".into()))
    }
}
