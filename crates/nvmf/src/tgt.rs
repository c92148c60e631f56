//! The target: its subsystems and controllers, the runtime threads
//! serving them, and its listeners.
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use pollux_bdev::NoNvme;
use pollux_nvme::Transport;
use pollux_runtime::{Runtime, RuntimeHandle, RuntimeOptions, SignalWatcher};
use pollux_spec::fabrics::DISCOVERY_NQN;

use crate::config::{ConfigError, TargetConfig};
use crate::model::{ModelError, Subsys, SubsysParams};
use crate::pool::Pool;
use crate::shared::{Shared, SubsysEntry};
use crate::tcp::server::init;
use crate::tcp::sock;

/// Why a target did not start.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("subsystem '{nqn}': {source}")]
    Model {
        nqn: String,
        #[source]
        source: ModelError,
    },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] pollux_runtime::Error),
}

/// A serial number made from the NQN (at most 20 characters).
fn default_serial(nqn: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in nqn.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("PLX{:016X}", h)[..19].to_string()
}

/// A running NVMe/TCP target. `T`: the NVMe transport of its bdevs
/// ([`NoNvme`] when none is an NVMe namespace).
pub struct Target<T: Transport = NoNvme> {
    rt: RuntimeHandle,
    shared: Arc<Shared<T>>,
}

impl<T: Transport> Target<T> {
    /// Binds the listeners, builds the subsystems and starts one runtime
    /// thread per core of `cores` serving connections.
    pub fn start(
        cfg: TargetConfig<T>,
        cores: &[usize],
        rt_opts: RuntimeOptions,
    ) -> Result<Target<T>, TargetError> {
        cfg.validate()?;
        let o = cfg.transport.clone();
        // Each connection is a descriptor: take what the hard limit allows.
        match sock::raise_nofile() {
            Ok((before, after)) => {
                let want = (o.max_connections as u64).saturating_add(64);
                if after < want {
                    tracing::warn!(
                        limit = after,
                        max_connections = o.max_connections,
                        "the descriptor limit (RLIMIT_NOFILE hard limit) is below max_connections + 64: accept will back off when it is reached"
                    );
                } else if before != after {
                    tracing::debug!(before, after, "descriptor limit raised to the hard limit");
                }
            }
            Err(e) => tracing::warn!("raising the descriptor limit (RLIMIT_NOFILE): {e}"),
        }
        // Bind each distinct address once; port 0 becomes a real port.
        let mut bound: Vec<(SocketAddr, SocketAddr, TcpListener)> = Vec::new();
        for s in &cfg.subsystems {
            for &addr in &s.listeners {
                if bound.iter().any(|(a, _, _)| *a == addr) {
                    continue;
                }
                let l = TcpListener::bind(addr)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|source| TargetError::Listen { addr, source })?;
                let real = l
                    .local_addr()
                    .map_err(|source| TargetError::Listen { addr, source })?;
                bound.push((addr, real, l));
            }
        }
        let real = |a: &SocketAddr| {
            bound
                .iter()
                .find(|(c, _, _)| c == a)
                .map_or(*a, |(_, r, _)| *r)
        };
        let mut subsystems = Vec::new();
        for s in &cfg.subsystems {
            let p = SubsysParams {
                nqn: s.nqn.clone(),
                serial: s.serial.clone().unwrap_or_else(|| default_serial(&s.nqn)),
                model: s.model.clone().unwrap_or_else(|| "pollux".into()),
                queue_entries: o.max_queue_depth,
                max_io_queues: o.max_io_qpairs_per_ctrlr,
                max_io_size: o.max_io_size,
                in_capsule_data: o.in_capsule_data_size,
                kas: o.kas,
            };
            let model =
                Subsys::new(&p, cfg.ns_bdevs(s), false).map_err(|source| TargetError::Model {
                    nqn: s.nqn.clone(),
                    source,
                })?;
            subsystems.push(SubsysEntry {
                model,
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                listeners: s.listeners.iter().map(real).collect(),
            });
        }
        let dp = SubsysParams {
            nqn: DISCOVERY_NQN.into(),
            serial: "pollux-discovery".into(),
            model: "pollux discovery".into(),
            queue_entries: o.max_aq_depth,
            max_io_queues: 1,
            max_io_size: o.max_io_size,
            in_capsule_data: 0,
            kas: o.kas,
        };
        let discovery =
            Subsys::new(&dp, Vec::new(), true).map_err(|source| TargetError::Model {
                nqn: DISCOVERY_NQN.into(),
                source,
            })?;
        let pool_bytes = usize::try_from(o.pool_bytes()).unwrap_or(usize::MAX);
        let shared = Arc::new(Shared {
            opts: o,
            subsystems,
            discovery,
            listeners: bound.iter().map(|(_, r, _)| *r).collect(),
            ctrls: Mutex::default(),
            conns: Default::default(),
            data_conns: Default::default(),
            pool: Arc::new(Pool::new(pool_bytes)),
            cores: cores.to_vec(),
        });
        let listeners: Arc<Mutex<Option<Vec<TcpListener>>>> = Arc::new(Mutex::new(Some(
            bound.into_iter().map(|(_, _, l)| l).collect(),
        )));
        let sh = shared.clone();
        let rt = Runtime::start_with(cores, rt_opts, move |ctx| {
            let ls = if ctx.index() == 0 {
                listeners
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            init(ctx, sh.clone(), ls);
        })?;
        for a in &shared.listeners {
            tracing::info!(listen = %a, "NVMe/TCP target listening");
        }
        Ok(Target { rt, shared })
    }

    /// The addresses listened on (configured port 0 resolved).
    pub fn listen_addrs(&self) -> &[SocketAddr] {
        &self.shared.listeners
    }

    /// Controllers (host associations) alive.
    pub fn controllers(&self) -> usize {
        self.shared.table().map.len()
    }

    /// What the target's threads share (tests drive connections over
    /// memory with it).
    #[cfg(test)]
    pub(crate) fn shared(&self) -> Arc<Shared<T>> {
        self.shared.clone()
    }

    /// The runtime (tests run connections on its threads).
    #[cfg(test)]
    pub(crate) fn runtime(&self) -> &RuntimeHandle {
        &self.rt
    }

    /// Bytes of data buffers alive (in commands, or cached by the
    /// threads), and the pool's limit (`num_shared_buffers` x
    /// `io_unit_size`; in-capsule and admin data may pass it).
    pub fn buffer_bytes(&self) -> (usize, usize) {
        (self.shared.pool.used(), self.shared.pool.limit())
    }

    /// Connections open.
    pub fn connections(&self) -> usize {
        self.shared.conns.load(Relaxed)
    }

    /// Shuts down on SIGINT/SIGTERM (see [`Target::shutdown`]).
    pub fn stop_on_signals(&self) -> Result<SignalWatcher, TargetError> {
        Ok(self.rt.stop_on_signals()?)
    }

    /// Waits until the target has shut down.
    pub fn wait(&self) -> Result<(), TargetError> {
        Ok(self.rt.wait()?)
    }

    /// Stops accepting, lets commands in flight finish and their
    /// responses go out, closes every connection and joins the threads.
    pub fn shutdown(&self) -> Result<(), TargetError> {
        Ok(self.rt.shutdown()?)
    }
}
