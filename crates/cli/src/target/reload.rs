//! `pollux target -c FILE`'s reload: on SIGHUP (or JSON-RPC's
//! `pollux_reload_config`, pollux's own method) FILE is read again and
//! checked whole first (a file the target could not start from changes
//! nothing: logged at ERROR, naming the file and the culprit); then the
//! plan (`pollux_nvmf::config::plan`: what is made live, what only a
//! restart applies) is made through the target's live methods, those of
//! the JSON-RPC methods. Each change not applied is logged at WARN
//! ("restart to apply"), then one INFO line sums the reload up. Without
//! `-c` there is no file: a SIGHUP is logged and does nothing.
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pollux_nvmf::config::{plan, ConfigFile};
use pollux_nvmf::{ConfigError, Target};
use serde_json::{json, Value};

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no configuration file to reload (the target was started without -c)")]
    NoFile,
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Config {
        path: String,
        #[source]
        source: ConfigError,
    },
}

/// What a reload did.
#[derive(Debug, Default)]
pub struct ReloadReport {
    /// Changes made: (subsystem, change).
    pub applied: Vec<(String, String)>,
    /// Differences a restart applies.
    pub not_applied: Vec<String>,
    /// Changes the target refused.
    pub failed: Vec<String>,
}

impl ReloadReport {
    /// `pollux_reload_config`'s result.
    pub fn to_json(&self) -> Value {
        let applied: Vec<String> = self
            .applied
            .iter()
            .map(|(w, c)| format!("{w}: {c}"))
            .collect();
        json!({"applied": applied, "not_applied": self.not_applied, "failed": self.failed})
    }
}

/// Reloads a target's configuration file.
pub struct Reloader {
    target: Arc<Target>,
    /// The file, and what it said when the target started (None: the
    /// file could not be read again at start).
    file: Option<(PathBuf, Result<ConfigFile, String>)>,
    /// One reload at a time.
    busy: Mutex<()>,
}

impl Reloader {
    /// The reloader of `target`, started from `path` whose text was
    /// `json` (None: quick mode, nothing to reload).
    pub fn new(target: Arc<Target>, path: Option<&str>, json: Option<&str>) -> Reloader {
        let file = path.map(|p| {
            let started = match json {
                Some(j) => ConfigFile::parse(j).map_err(|e| e.to_string()),
                None => Err("could not be read again".to_string()),
            };
            (PathBuf::from(p), started)
        });
        Reloader {
            target,
            file,
            busy: Mutex::new(()),
        }
    }

    /// Reads the file again and applies it (see the module docs); logs
    /// what it did.
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let _one = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some((path, started)) = &self.file else {
            tracing::warn!("reload asked for: {}; nothing changed", ReloadError::NoFile);
            return Err(ReloadError::NoFile);
        };
        let name = path.display().to_string();
        let refused = |e: ReloadError| {
            // (`e` names the file.)
            tracing::error!(
                "configuration reload refused, the target keeps its configuration: {e}"
            );
            e
        };
        let json = std::fs::read_to_string(path).map_err(|source| {
            refused(ReloadError::Read {
                path: name.clone(),
                source,
            })
        })?;
        let new = ConfigFile::parse(&json).map_err(|source| {
            refused(ReloadError::Config {
                path: name.clone(),
                source,
            })
        })?;
        let started = match started {
            Ok(s) => s,
            Err(why) => {
                // (Cannot tell what changed since the start.)
                let e = ReloadError::Config {
                    path: name.clone(),
                    source: ConfigError::Shape(format!(
                        "the file the target started from {why}: nothing can be compared with it"
                    )),
                };
                return Err(refused(e));
            }
        };
        let p = plan(started, &new, &self.target.running());
        for w in &p.not_applied {
            tracing::warn!("reload of {name}: not applied, restart to apply: {w}");
        }
        let done = self.target.apply_reload(&p);
        for f in &done.failed {
            tracing::error!("reload of {name}: refused by the target: {f}");
        }
        let r = ReloadReport {
            applied: done.applied,
            not_applied: p.not_applied,
            failed: done.failed,
        };
        tracing::info!("{}", summary(&name, &r));
        Ok(r)
    }
}

/// The one line that sums a reload up.
fn summary(name: &str, r: &ReloadReport) -> String {
    if r.applied.is_empty() && r.not_applied.is_empty() && r.failed.is_empty() {
        return format!("configuration reloaded from {name}: no change");
    }
    let mut s = format!(
        "configuration reloaded from {name}: {} change(s) made",
        r.applied.len()
    );
    if !r.applied.is_empty() {
        // Each subsystem once: "subsystem 'A': x, y; subsystem 'B': z".
        let mut parts: Vec<(String, Vec<&str>)> = Vec::new();
        for (w, c) in &r.applied {
            match parts.iter_mut().find(|(x, _)| x == w) {
                Some((_, v)) => v.push(c),
                None => parts.push((w.clone(), vec![c])),
            }
        }
        let parts: Vec<String> = parts
            .iter()
            .map(|(w, v)| format!("{w}: {}", v.join(", ")))
            .collect();
        s.push_str(&format!(" ({})", parts.join("; ")));
    }
    if !r.not_applied.is_empty() {
        s.push_str(&format!(
            ", {} not applied (restart to apply)",
            r.not_applied.len()
        ));
    }
    if !r.failed.is_empty() {
        s.push_str(&format!(", {} refused by the target", r.failed.len()));
    }
    s
}

/// A thread that reloads on each SIGHUP (the process no longer dies of
/// it); dropping it stops watching.
pub struct HangupWatcher {
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl HangupWatcher {
    pub fn start(r: Arc<Reloader>) -> std::io::Result<HangupWatcher> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("pollux-tgt-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    tracing::info!("SIGHUP: reloading the configuration");
                    // (Logged by reload.)
                    let _ = r.reload();
                }
            })?;
        Ok(HangupWatcher {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for HangupWatcher {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_was_made_and_what_was_not() {
        let mut r = ReloadReport::default();
        assert_eq!(
            summary("/etc/t.json", &r),
            "configuration reloaded from /etc/t.json: no change"
        );
        for (w, c) in [
            ("subsystem 'n'", "listener 1.2.3.4:1 added"),
            ("the discovery subsystem", "listener 1.2.3.4:2 added"),
            ("subsystem 'n'", "host h removed"),
        ] {
            r.applied.push((w.into(), c.into()));
        }
        r.not_applied.push("bdev 'Malloc0' changed".into());
        assert_eq!(
            summary("/etc/t.json", &r),
            "configuration reloaded from /etc/t.json: 3 change(s) made (subsystem 'n': listener 1.2.3.4:1 added, host h removed; the discovery subsystem: listener 1.2.3.4:2 added), 1 not applied (restart to apply)"
        );
        r.failed.push("x".into());
        assert!(summary("f", &r).ends_with(", 1 refused by the target"));
        assert_eq!(
            r.to_json()["applied"][1],
            "the discovery subsystem: listener 1.2.3.4:2 added"
        );
    }
}
