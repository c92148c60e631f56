//! Namespaces added to and removed from a running target's subsystems
//! while hosts are connected ([`Target::add_namespace`],
//! [`Target::remove_namespace`]), as SPDK's `nvmf_subsystem_add_ns` /
//! `_remove_ns` and Linux's nvmet do.
//!
//! The change is made in the subsystem's model (`model::Subsys`: the
//! controller model's namespace table and generation), which notes it in
//! every controller's Changed Namespace List; then each connected
//! controller's admin queue is sent a message on its runtime thread
//! (`QueueTransport::queue_events`), where the controller raises the
//! Namespace Attribute Changed event (if its host enabled it) and a held
//! Asynchronous Event Request completes. The I/O queues, on every
//! thread, notice the change at their next connection pass (one relaxed
//! load of the generation; see `pollux-controller`'s `io`): channels to new
//! namespaces open, a removed namespace's commands get Invalid Namespace
//! and its requests in flight finish first.
use pollux_bdev::Bdev;
use pollux_controller::NsIds;

use crate::live::LiveError;
use crate::model::NsError;
use crate::shared::SubsysId;
use crate::tgt::Target;

impl LiveError {
    fn from_ns(nqn: &str, e: NsError) -> LiveError {
        let nqn = nqn.to_string();
        match e {
            NsError::Taken(nsid) => LiveError::NsidTaken { nqn, nsid },
            NsError::Absent(nsid) => LiveError::NoNamespace { nqn, nsid },
            NsError::Invalid(nsid, why) => LiveError::InvalidNsid { nqn, nsid, why },
            NsError::Bdev(bdev, why) => LiveError::InvalidBdev { nqn, bdev, why },
            NsError::Other(why) => LiveError::Other { nqn, why },
        }
    }
}

impl Target {
    /// Adds `bdev` (all of it; 512-byte or 4 KiB blocks) to subsystem
    /// `nqn` as namespace `nsid` (None: the lowest free NSID) while hosts
    /// are connected; returns its NSID. Each connected controller is told
    /// (Changed Namespace List, Namespace Attribute Changed event). Call
    /// it from a thread that is not one of the target's runtime threads
    /// (an RPC handler's).
    pub fn add_namespace(
        &self,
        nqn: &str,
        bdev: Bdev,
        nsid: Option<u32>,
    ) -> Result<u32, LiveError> {
        self.add_namespace_with(nqn, bdev, nsid, NsIds::default(), 0)
    }

    /// [`Target::add_namespace`] with identifiers of its own (SPDK's
    /// `uuid`, `nguid`, `eui64`: what two targets exporting the same
    /// storage give it) and ANA group `anagrpid` (0: its NSID).
    pub fn add_namespace_with(
        &self,
        nqn: &str,
        bdev: Bdev,
        nsid: Option<u32>,
        ids: NsIds,
        anagrpid: u32,
    ) -> Result<u32, LiveError> {
        let (id, entry) = self.nvm_subsystem(nqn)?;
        let name = bdev.name().to_string();
        let nsid = entry
            .model
            .add_namespace(bdev, nsid, ids, anagrpid)
            .map_err(|e| LiveError::from_ns(nqn, e))?;
        tracing::info!(subnqn = nqn, nsid, bdev = %name, "namespace added live");
        self.announce(id);
        Ok(nsid)
    }

    /// Removes namespace `nsid` of subsystem `nqn` while hosts are
    /// connected; returns its bdev (the I/O queues still hold channels to
    /// it until their commands in flight are over). Each connected
    /// controller is told, as by [`Target::add_namespace`]. Not from a
    /// runtime thread.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<Bdev, LiveError> {
        let (id, entry) = self.nvm_subsystem(nqn)?;
        let bdev = entry
            .model
            .remove_namespace(nsid)
            .map_err(|e| LiveError::from_ns(nqn, e))?;
        tracing::info!(subnqn = nqn, nsid, bdev = %bdev.name(), "namespace removed live");
        self.announce(id);
        Ok(bdev)
    }

    /// The namespaces of subsystem `nqn`: (NSID, bdev), NSID order.
    pub fn namespaces(&self, nqn: &str) -> Result<Vec<(u32, Bdev)>, LiveError> {
        let (_, entry) = self.nvm_subsystem(nqn)?;
        Ok(entry.model.namespace_bdevs())
    }

    fn nvm_subsystem(
        &self,
        nqn: &str,
    ) -> Result<(SubsysId, std::sync::Arc<crate::shared::SubsysEntry>), LiveError> {
        let shared = self.shared();
        let subs = shared.subsystems();
        match shared.find(&subs, nqn) {
            Some((id, Some(entry))) => Ok((id, entry)),
            Some((_, None)) => Err(LiveError::Discovery { nqn: nqn.into() }),
            None => Err(LiveError::NoSubsystem { nqn: nqn.into() }),
        }
    }

    /// Tells each controller of subsystem `id` on its admin queue's
    /// thread that its namespaces changed.
    pub(crate) fn announce(&self, id: SubsysId) {
        let shared = self.shared();
        let admins: Vec<_> = shared
            .table()
            .map
            .iter()
            .filter(|(_, e)| e.subsys == id)
            .map(|(&cntlid, e)| (cntlid, e.admin))
            .collect();
        for (cntlid, r) in admins {
            let (conn, events) = (r.conn, r.events);
            if let Err(e) = self.runtime().send(r.thread, move |ctx| events(ctx, conn)) {
                tracing::warn!(cntlid, thread = r.thread, "namespace change notice: {e}");
            }
        }
    }
}
