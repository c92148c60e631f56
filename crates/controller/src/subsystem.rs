//! The subsystem: what every controller of it shares (an `Arc<Subsystem>`
//! is cheap to hand to every thread): the identity, the limits and the
//! personality (PCIe or Fabrics), fixed once built, and the namespaces
//! (NSID → bdev, LBA size, size in blocks), which
//! [`Subsystem::add_namespace`] and [`Subsystem::remove_namespace`]
//! change while controllers run.
//!
//! The namespace set is an immutable table behind a mutex, replaced
//! whole on each change, with a generation counter bumped after: an I/O
//! queue compares the counter (one relaxed load per batch of commands,
//! `IoQueue::sync_namespaces`) with the one
//! its channels were opened at and only then takes the table (see
//! `io`). Each change is also noted for every controller (`notices`):
//! its Changed Namespace List and the Namespace Attribute Changed event.
//!
//! A namespace is any bdev (`pollux_bdev::Bdev`): null, RAM, io_uring, or
//! an NVMe namespace on any transport, side by side in one subsystem.
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use pollux_bdev::Bdev;

use crate::notice::Notices;
use crate::ControllerError;

/// Most namespaces a subsystem may have (Identify NN).
pub const MAX_NAMESPACES: usize = 1024;
/// Largest MDTS accepted (4 KiB << 16 = 256 MiB).
pub const MAX_MDTS: u8 = 16;

/// Identify Controller's identity fields.
#[derive(Clone, Debug)]
pub struct Identity {
    /// SN: 1..=20 printable ASCII characters.
    pub serial: String,
    /// MN: at most 40 printable ASCII characters.
    pub model: String,
    /// FR and firmware slot 1: at most 8 printable ASCII characters.
    pub firmware: String,
    /// PCI vendor ID (VID).
    pub vid: u16,
    /// PCI subsystem vendor ID (SSVID).
    pub ssvid: u16,
    /// IEEE OUI identifier.
    pub ieee: [u8; 3],
    /// NVM Subsystem NVMe Qualified Name (at most 223 bytes).
    pub subnqn: String,
}

/// Limits every controller of the subsystem reports and enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// CAP.MQES (0's based), at least 1.
    pub mqes: u16,
    /// I/O queues granted at most by Set Features Number of Queues.
    pub max_io_queues: u16,
    /// Identify MDTS: max transfer is `4 KiB << mdts`; 0 = unlimited.
    pub mdts: u8,
    /// Identify ACL (0's based), at most 15.
    pub abort_limit: u8,
    /// Identify AERL (0's based), at most 15.
    pub aer_limit: u8,
    /// CAP.TO (500 ms units), at least 1.
    pub cap_to: u8,
}

impl Limits {
    /// Largest data transfer in bytes (`None` = unlimited).
    pub fn max_transfer(&self) -> Option<usize> {
        (self.mdts != 0).then(|| 4096usize << self.mdts)
    }
}

/// What the PCIe transport adds.
#[derive(Clone, Copy, Debug)]
pub struct PcieTraits {
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// Interrupt vectors (MSI-X table size), at least 1: Interrupt
    /// Coalescing and Interrupt Vector Configuration exist.
    pub irq_vectors: u16,
    /// Doorbell Buffer Config is advertised (OACS bit 8).
    pub shadow_doorbells: bool,
}

/// What a fabrics transport adds (Identify Controller's fabrics fields).
#[derive(Clone, Copy, Debug)]
pub struct FabricsTraits {
    /// Bytes of in-capsule data an I/O command capsule may carry (IOCCSZ
    /// is the command, 64 bytes, plus this, in 16-byte units).
    pub in_capsule_data: u32,
    /// KAS: Keep Alive granularity, 100 ms units (0: no Keep Alive).
    pub kas: u16,
}

/// The kind of controller the subsystem's controllers are.
#[derive(Clone, Copy, Debug)]
pub enum Personality {
    /// An NVMe PCIe controller (the emulator).
    Pcie(PcieTraits),
    /// An NVMe-oF I/O controller (dynamic controller model). A discovery
    /// personality (CNTRLTYPE discovery) would be a third variant.
    Fabrics(FabricsTraits),
}

impl Personality {
    pub fn is_fabrics(&self) -> bool {
        matches!(self, Personality::Fabrics(_))
    }

    /// Interrupt vectors (0 for fabrics).
    pub fn irq_vectors(&self) -> u16 {
        match self {
            Personality::Pcie(p) => p.irq_vectors,
            Personality::Fabrics(_) => 0,
        }
    }
}

/// A namespace's identifiers given by the configuration (EUI-64, NGUID,
/// UUID), instead of those derived from the serial number and NSID: two
/// targets exporting the same storage give it the same identifiers, so a
/// host sees one namespace through both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsIds {
    pub eui64: Option<[u8; 8]>,
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
}

/// One namespace: its bdev and geometry.
pub struct Namespace {
    bdev: Bdev,
    lba_shift: u8,
    nsze: u64,
    /// ANA group (0: the NSID, as SPDK does).
    anagrpid: u32,
    ids: NsIds,
    /// Unique per `Namespace::new` (clones share it): tells an I/O queue
    /// whether an NSID still names the namespace its channel is to.
    id: u64,
}

/// The next `Namespace::id`.
static NEXT_NS_ID: AtomicU64 = AtomicU64::new(1);

impl Clone for Namespace {
    fn clone(&self) -> Self {
        Namespace {
            bdev: self.bdev.clone(),
            lba_shift: self.lba_shift,
            nsze: self.nsze,
            anagrpid: self.anagrpid,
            ids: self.ids,
            id: self.id,
        }
    }
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("bdev", &self.bdev.name())
            .field("lba_shift", &self.lba_shift)
            .field("nsze", &self.nsze)
            .finish()
    }
}

impl Namespace {
    /// The first `nsze` blocks of `bdev` (0: all of it), whose block size
    /// must be 512 or 4096 bytes (the LBA formats Identify reports).
    pub fn new(bdev: Bdev, nsze: u64) -> Result<Namespace, ControllerError> {
        let info = bdev.info();
        let bad = |why: String| {
            Err(ControllerError::InvalidNamespace {
                bdev: info.name.clone(),
                why,
            })
        };
        let lba_shift = info.block_shift() as u8;
        if lba_shift != 9 && lba_shift != 12 {
            return bad(format!(
                "block size {} is not 512 or 4096 bytes",
                info.block_size
            ));
        }
        let nsze = if nsze == 0 { info.num_blocks } else { nsze };
        if nsze > info.num_blocks {
            return bad(format!(
                "{nsze} blocks requested but the bdev has {}",
                info.num_blocks
            ));
        }
        Ok(Namespace {
            bdev,
            lba_shift,
            nsze,
            anagrpid: 0,
            ids: NsIds::default(),
            id: NEXT_NS_ID.fetch_add(1, Relaxed),
        })
    }

    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// log2 of the LBA size.
    pub fn lba_shift(&self) -> u8 {
        self.lba_shift
    }

    /// Size in logical blocks.
    pub fn nsze(&self) -> u64 {
        self.nsze
    }

    /// In ANA group `anagrpid` (0: the group of its NSID's number).
    pub fn with_anagrpid(mut self, anagrpid: u32) -> Namespace {
        self.anagrpid = anagrpid;
        self
    }

    /// With identifiers of its own (see [`NsIds`]).
    pub fn with_ids(mut self, ids: NsIds) -> Namespace {
        self.ids = ids;
        self
    }

    /// The ANA group as configured (0: its NSID).
    pub fn anagrpid_config(&self) -> u32 {
        self.anagrpid
    }

    /// Its ANA group as namespace `nsid`.
    pub fn anagrpid(&self, nsid: u32) -> u32 {
        if self.anagrpid == 0 {
            nsid
        } else {
            self.anagrpid
        }
    }

    /// The identifiers the configuration gave.
    pub fn ids(&self) -> &NsIds {
        &self.ids
    }

    /// Identity of this namespace (shared by its clones only).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// The namespaces at one generation: slot `nsid - 1`, `None` for an
/// inactive NSID (no trailing `None`).
pub(crate) type NsTable = Arc<Vec<Option<Namespace>>>;

/// What every controller of the subsystem shares.
pub struct Subsystem {
    identity: Identity,
    limits: Limits,
    personality: Personality,
    namespaces: Mutex<NsTable>,
    /// Bumped (after the table is replaced) on each namespace change.
    generation: AtomicU64,
    /// Each controller's changed-namespace notes.
    pub(crate) notices: Notices,
    /// Asymmetric Namespace Access reporting (CMIC bit 3, the ANA log).
    ana_reporting: AtomicBool,
    /// Several controllers, through several ports, may share the
    /// namespaces (CMIC bits 0 and 1, NMIC bit 0): a host may make one
    /// namespace of several paths.
    multipath: AtomicBool,
}

/// NSID FFFFFFFFh (every namespace) and 0 are never a namespace's.
const NSID_ALL: u32 = 0xFFFF_FFFF;

impl std::fmt::Debug for Subsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subsystem")
            .field("identity", &self.identity)
            .field("limits", &self.limits)
            .field("personality", &self.personality)
            .field("namespaces", &self.table())
            .finish()
    }
}

fn ascii_ok(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

impl Subsystem {
    /// Checks every bound the controller relies on. NSIDs are `1..=n` in
    /// the order given.
    pub fn new(
        identity: Identity,
        limits: Limits,
        personality: Personality,
        namespaces: Vec<Namespace>,
    ) -> Result<Arc<Subsystem>, ControllerError> {
        let bad = |m: String| Err(ControllerError::InvalidConfig(m));
        if identity.serial.is_empty() || !ascii_ok(&identity.serial, 20) {
            return bad("serial must be 1..=20 printable ASCII characters".into());
        }
        if !ascii_ok(&identity.model, 40) {
            return bad("model must be at most 40 printable ASCII characters".into());
        }
        if !ascii_ok(&identity.firmware, 8) {
            return bad("firmware must be at most 8 printable ASCII characters".into());
        }
        if identity.subnqn.len() > 223 {
            return bad(format!(
                "subsystem NQN {:?} longer than 223 bytes",
                identity.subnqn
            ));
        }
        if namespaces.len() > MAX_NAMESPACES {
            return bad(format!(
                "{} namespaces (max {MAX_NAMESPACES})",
                namespaces.len()
            ));
        }
        if limits.mqes < 1 {
            return bad("mqes must be at least 1 (2 entries)".into());
        }
        if limits.max_io_queues == 0 {
            return bad("max_io_queues must be at least 1".into());
        }
        if limits.mdts > MAX_MDTS {
            return bad(format!("mdts {} > {MAX_MDTS}", limits.mdts));
        }
        if limits.cap_to == 0 {
            return bad("cap_to must be at least 1".into());
        }
        if limits.abort_limit > 15 || limits.aer_limit > 15 {
            return bad("abort_limit and aer_limit must be at most 15".into());
        }
        match personality {
            Personality::Pcie(p) if p.irq_vectors == 0 => {
                return bad("irq_vectors must be at least 1".into());
            }
            // IOCCSZ counts 16-byte units (and is a 32-bit field).
            Personality::Fabrics(f)
                if f.in_capsule_data % 16 != 0 || f.in_capsule_data > u32::MAX - 64 =>
            {
                return bad(format!(
                    "in-capsule data size {} is not a multiple of 16 bytes",
                    f.in_capsule_data
                ));
            }
            _ => {}
        }
        Ok(Arc::new(Subsystem {
            identity,
            limits,
            personality,
            namespaces: Mutex::new(Arc::new(namespaces.into_iter().map(Some).collect())),
            generation: AtomicU64::new(0),
            notices: Notices::default(),
            ana_reporting: AtomicBool::new(false),
            multipath: AtomicBool::new(false),
        }))
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn personality(&self) -> &Personality {
        &self.personality
    }

    /// Turns ANA reporting on or off (before controllers connect); ANA
    /// reporting implies multipath (see [`Subsystem::set_multipath`]).
    pub fn set_ana_reporting(&self, on: bool) {
        self.ana_reporting.store(on, Relaxed);
    }

    pub fn ana_reporting(&self) -> bool {
        self.ana_reporting.load(Relaxed)
    }

    /// Reports the subsystem as multi-port and multi-controller, its
    /// namespaces as shared (before controllers connect).
    pub fn set_multipath(&self, on: bool) {
        self.multipath.store(on, Relaxed);
    }

    pub fn multipath(&self) -> bool {
        self.multipath.load(Relaxed) || self.ana_reporting()
    }

    /// An ANA state of a port changed: every I/O queue recomputes which
    /// namespaces it refuses at its next `IoQueue::sync_namespaces` (the
    /// namespace generation is bumped; the table is unchanged).
    pub fn ana_changed(&self) {
        let _t = self.lock_table();
        self.generation.fetch_add(1, Release);
    }

    /// The ANA groups of the active namespaces: (ANAGRPID, NSIDs
    /// ascending), ANAGRPID order.
    pub fn ana_groups(&self) -> Vec<(u32, Vec<u32>)> {
        let mut g: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for (nsid, ns) in self.namespaces() {
            g.entry(ns.anagrpid(nsid)).or_default().push(nsid);
        }
        g.into_iter().collect()
    }

    fn lock_table(&self) -> MutexGuard<'_, NsTable> {
        // A poisoned lock is taken over: the table is replaced whole.
        self.namespaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The namespace table now (slot `nsid - 1`).
    pub(crate) fn table(&self) -> NsTable {
        self.lock_table().clone()
    }

    /// The generation of the namespace set (bumped by each change; one
    /// relaxed load).
    #[inline(always)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// The table and the generation it is at (or later).
    pub(crate) fn table_at(&self) -> (u64, NsTable) {
        let t = self.lock_table();
        (self.generation.load(Relaxed), t.clone())
    }

    /// The active namespaces now: (NSID, namespace), NSID order.
    pub fn namespaces(&self) -> Vec<(u32, Namespace)> {
        self.table()
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i as u32 + 1, n.clone()?)))
            .collect()
    }

    /// Namespace `nsid` (1-based), if it is active.
    pub fn namespace(&self, nsid: u32) -> Option<Namespace> {
        self.table().get((nsid as usize).wrapping_sub(1))?.clone()
    }

    /// Adds namespace `ns` as `nsid` (None: the lowest free NSID) while
    /// the controllers run; returns its NSID. Refused: NSID 0 or
    /// FFFFFFFFh, beyond [`MAX_NAMESPACES`], or taken. Every controller
    /// notes the change (Changed Namespace List, Namespace Attribute
    /// Changed event); I/O queues open a channel to it at their next
    /// `IoQueue::sync_namespaces`.
    pub fn add_namespace(&self, ns: Namespace, nsid: Option<u32>) -> Result<u32, ControllerError> {
        if ns.anagrpid as usize > MAX_NAMESPACES {
            return Err(ControllerError::InvalidNamespace {
                bdev: ns.bdev.name().to_string(),
                why: format!(
                    "ANA group ID {} is beyond ANAGRPMAX ({MAX_NAMESPACES})",
                    ns.anagrpid
                ),
            });
        }
        let nsid = {
            let mut t = self.lock_table();
            let nsid = match nsid {
                Some(n) if n == 0 || n == NSID_ALL => {
                    return Err(ControllerError::Nsid {
                        nsid: n,
                        why: "is not a valid namespace ID",
                    })
                }
                Some(n) if n as usize > MAX_NAMESPACES => {
                    return Err(ControllerError::Nsid {
                        nsid: n,
                        why: "is beyond the subsystem's most namespaces (1024)",
                    })
                }
                Some(n) if t.get(n as usize - 1).is_some_and(Option::is_some) => {
                    return Err(ControllerError::NsidTaken { nsid: n })
                }
                Some(n) => n,
                None => match t.iter().position(Option::is_none) {
                    Some(i) => i as u32 + 1,
                    None if t.len() < MAX_NAMESPACES => t.len() as u32 + 1,
                    None => return Err(ControllerError::Nsid {
                        nsid: MAX_NAMESPACES as u32 + 1,
                        why:
                            "is beyond the subsystem's most namespaces (1024): every NSID is taken",
                    }),
                },
            };
            let mut v: Vec<Option<Namespace>> = t.as_ref().clone();
            let i = nsid as usize - 1;
            if v.len() <= i {
                v.resize(i + 1, None);
            }
            v[i] = Some(ns);
            *t = Arc::new(v);
            self.generation.fetch_add(1, Release);
            nsid
        };
        tracing::info!(subnqn = %self.identity.subnqn, nsid, "namespace added");
        self.notices.changed(nsid);
        Ok(nsid)
    }

    /// Removes namespace `nsid` while the controllers run; returns it.
    /// Its commands get Invalid Namespace or Format once each I/O queue
    /// noticed (at its next `IoQueue::sync_namespaces`); those in flight
    /// finish first (a queue keeps the channel until they are over).
    pub fn remove_namespace(&self, nsid: u32) -> Result<Namespace, ControllerError> {
        let ns = {
            let mut t = self.lock_table();
            let i = (nsid as usize).wrapping_sub(1);
            if t.get(i).is_none_or(Option::is_none) {
                return Err(ControllerError::NoNamespace { nsid });
            }
            let mut v: Vec<Option<Namespace>> = t.as_ref().clone();
            let ns = v[i].take();
            while v.last().is_some_and(Option::is_none) {
                v.pop();
            }
            *t = Arc::new(v);
            self.generation.fetch_add(1, Release);
            ns
        };
        tracing::info!(subnqn = %self.identity.subnqn, nsid, "namespace removed");
        self.notices.changed(nsid);
        ns.ok_or(ControllerError::NoNamespace { nsid })
    }
}
