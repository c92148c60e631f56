//! [`Multipath`]: the paths of one namespace, checked to be the same
//! namespace, and the queue pairs over them.
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};
use std::sync::Arc;

use pollux_nvme::QpairOptions;

use super::ident::NsIdentity;
use super::paths::{Path, Paths, Policy, Selector, ANA_REFRESH, OPTIMIZED};
use super::qpair::MpQueuePair;
use crate::ctrl::Controller;
use crate::trid::Trid;

/// Most paths of one namespace.
pub const MAX_PATHS: usize = 64;

/// Why paths could not make one multipath namespace.
#[derive(Debug, thiserror::Error)]
pub enum MultipathError {
    #[error("multipath needs at least one path")]
    NoPaths,
    #[error("multipath: at most {MAX_PATHS} paths, not {0}")]
    TooManyPaths(usize),
    #[error("path {path}: no namespace {nsid}")]
    NoNamespace { path: String, nsid: u32 },
    #[error("path {path}: {why}")]
    Identify { path: String, why: String },
    #[error("path {path}: namespace {nsid} has no NGUID, EUI-64 or UUID, so another path cannot be shown to lead to it")]
    NoIdentifier { path: String, nsid: u32 },
    /// The path leads to another namespace than the first path.
    #[error("path {path} is not a path to the namespace of {first}: {what}")]
    Mismatch {
        path: String,
        first: String,
        what: String,
    },
    #[error("path {index} (of {total}): {source}")]
    Connect {
        index: usize,
        total: usize,
        #[source]
        source: crate::ConnectError,
    },
    #[error("path {path}: {source}")]
    Qpair {
        path: String,
        #[source]
        source: pollux_nvme::Error,
    },
}

/// A transport ID as a multipath path uses it: an NVMe/TCP path with no
/// `fast_io_fail_tmo` given fails the I/O it holds as soon as a
/// reconnect attempt fails (`fast_io_fail_tmo:0`), so the I/O moves to
/// another path instead of waiting for the reconnect.
pub fn path_trid(t: &Trid) -> Trid {
    let mut t = t.clone();
    if let Trid::Tcp(tcp) = &mut t {
        if tcp.fast_io_fail_tmo < 0 {
            tcp.fast_io_fail_tmo = 0;
        }
    }
    t
}

/// One namespace over several controllers. Shared by the threads that
/// make queue pairs over it (`Sync`).
pub struct Multipath {
    paths: Arc<Paths>,
}

impl Multipath {
    /// Namespace `nsid` (None: the first of the first path) over the
    /// controllers `paths` (each with its name for messages, e.g. its
    /// transport ID), in order of preference for
    /// [`Policy::ActivePassive`]. Refuses a path whose subsystem NQN,
    /// namespace identifiers (NGUID, EUI-64, UUID), block size or size
    /// differ from the first path's, naming it. Reads each path's ANA
    /// state.
    pub fn new(
        paths: Vec<(String, Controller)>,
        nsid: Option<u32>,
        policy: Policy,
        selector: Selector,
    ) -> Result<Multipath, MultipathError> {
        if paths.is_empty() {
            return Err(MultipathError::NoPaths);
        }
        if paths.len() > MAX_PATHS {
            return Err(MultipathError::TooManyPaths(paths.len()));
        }
        let mut list = Vec::with_capacity(paths.len());
        let mut first: Option<NsIdentity> = None;
        for (name, ctrl) in paths {
            let want = nsid.or_else(|| ctrl.namespaces().first().map(|n| n.nsid()));
            let Some(ns) = want.and_then(|n| ctrl.namespace(n)) else {
                return Err(MultipathError::NoNamespace {
                    path: name,
                    nsid: want.unwrap_or(1),
                });
            };
            let id = NsIdentity::read(&ctrl, &ns).map_err(|why| MultipathError::Identify {
                path: name.clone(),
                why,
            })?;
            if !id.has_identifier() {
                return Err(MultipathError::NoIdentifier {
                    path: name,
                    nsid: id.nsid,
                });
            }
            match &first {
                None => first = Some(id.clone()),
                Some(f) => {
                    if let Some(what) = f.mismatch(&id) {
                        let first: &Path = &list[0];
                        return Err(MultipathError::Mismatch {
                            path: name,
                            first: first.name.clone(),
                            what,
                        });
                    }
                }
            }
            list.push(Path {
                name,
                ctrl,
                ns,
                anagrpid: id.anagrpid,
                rank: AtomicU8::new(OPTIMIZED),
            });
        }
        let paths = Paths {
            list,
            policy,
            selector,
            ana_gen: AtomicU32::new(0),
            epoch: std::time::Instant::now(),
            ana_due: AtomicU64::new(ANA_REFRESH.as_millis() as u64),
        };
        paths.read_all_ana();
        Ok(Multipath {
            paths: Arc::new(paths),
        })
    }

    /// Connects to every transport ID (through [`path_trid`]) and makes
    /// the multipath namespace of them: [`crate::connect`] and
    /// [`Multipath::new`].
    pub fn connect(
        trids: &[Trid],
        opts: &crate::ControllerOptions,
        nsid: Option<u32>,
        policy: Policy,
        selector: Selector,
    ) -> Result<Multipath, MultipathError> {
        let mut paths = Vec::with_capacity(trids.len());
        for (index, t) in trids.iter().enumerate() {
            let ctrl =
                crate::connect(&path_trid(t), opts).map_err(|source| MultipathError::Connect {
                    index,
                    total: trids.len(),
                    source,
                })?;
            paths.push((ctrl.describe(), ctrl));
        }
        Multipath::new(paths, nsid, policy, selector)
    }

    /// A queue pair on every path for one thread, holding up to
    /// `opts.depth` requests in flight (each path's queue pair holds as
    /// many as its controller's queues do; the rest wait in its backlog).
    pub fn alloc_qpair(&self, opts: QpairOptions) -> Result<MpQueuePair, MultipathError> {
        let slots = usize::from(opts.depth.max(1));
        let mut qps = Vec::with_capacity(self.paths.list.len());
        for p in &self.paths.list {
            let depth = opts.depth.min(p.ctrl.cap().mqes()).max(1);
            let qp = p
                .ctrl
                .alloc_qpair(QpairOptions {
                    depth,
                    ..opts.clone()
                })
                .map_err(|source| MultipathError::Qpair {
                    path: p.name.clone(),
                    source,
                })?;
            qps.push((qp, p.ns));
        }
        Ok(MpQueuePair::new(self.paths.clone(), qps, slots))
    }

    /// The paths' names, in order.
    pub fn path_names(&self) -> Vec<String> {
        self.paths.list.iter().map(|p| p.name.clone()).collect()
    }

    /// Path `i`'s controller.
    pub fn controller(&self, i: usize) -> Option<&Controller> {
        self.paths.list.get(i).map(|p| &p.ctrl)
    }

    /// The namespace as the first path's controller made it (block size
    /// and size are the same on every path).
    pub fn namespace(&self) -> pollux_nvme::Namespace {
        self.paths.list[0].ns
    }

    /// Paths.
    pub fn len(&self) -> usize {
        self.paths.list.len()
    }

    /// Never (a multipath namespace has a path); for clippy.
    pub fn is_empty(&self) -> bool {
        self.paths.list.is_empty()
    }

    pub fn policy(&self) -> Policy {
        self.paths.policy
    }

    pub fn selector(&self) -> Selector {
        self.paths.selector
    }

    /// Reads path `i`'s ANA state again (queue pairs take it on their
    /// next poll).
    pub fn refresh_ana(&self, i: usize) {
        if i < self.paths.list.len() {
            self.paths.refresh_ana(i);
        }
    }
}
