//! Whether the run's polling threads got their cores, for the status
//! lines and the summary. A polling thread (a runtime worker, the
//! emulated controllers' device thread) is pinned to its core; when other
//! processes hold that core it waits on the core's run queue, ready but
//! not running: on a shared machine that is what turns seconds into
//! "0 IOPS". Linux counts that wait per thread
//! (`/proc/self/task/<tid>/schedstat`: ns on the CPU, ns waiting on a run
//! queue), read once per status line: never on the I/O path.
use std::path::PathBuf;
use std::time::Instant;

/// A polling thread that waited for its core this share of the time that
/// passed or more is said to have been held off it.
pub const STARVED: f64 = 0.5;

/// The polling threads of this process and their CPU time at the last
/// look.
pub struct ThreadCpu {
    threads: Vec<Tracked>,
    at: Instant,
}

struct Tracked {
    /// What the notes call it: "the worker on core 0", "the emulated
    /// controller's thread".
    label: String,
    schedstat: PathBuf,
    waited_ns: u64,
}

/// The share of the time since the last look that a thread spent ready
/// to run but waiting for its core.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub label: String,
    pub waited: f64,
}

/// Time waiting on a run queue from a `schedstat` line ("run_ns wait_ns
/// slices").
fn waited_ns(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// What a thread named `name` is called in the notes, if it polls:
/// runtime threads are `<runtime_name>-<core>`, the device thread
/// `softnvme`.
fn label_of(name: &str, runtime_name: &str) -> Option<String> {
    if name == "softnvme" {
        return Some("the emulated controller's thread".into());
    }
    let core = name.strip_prefix(runtime_name)?.strip_prefix('-')?;
    core.parse::<usize>()
        .ok()
        .map(|c| format!("the worker on core {c}"))
}

impl ThreadCpu {
    /// The polling threads alive now: the runtime's (`runtime_name`) and
    /// the emulated controllers' device thread. Empty where `/proc` has
    /// no schedstat (then no notes are made).
    pub fn find(runtime_name: &str) -> ThreadCpu {
        let mut threads = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for e in dir.flatten() {
                let p = e.path();
                let Ok(comm) = std::fs::read_to_string(p.join("comm")) else {
                    continue;
                };
                let Some(label) = label_of(comm.trim(), runtime_name) else {
                    continue;
                };
                let schedstat = p.join("schedstat");
                let Some(waited) = std::fs::read_to_string(&schedstat)
                    .ok()
                    .and_then(|t| waited_ns(&t))
                else {
                    continue;
                };
                threads.push(Tracked {
                    label,
                    schedstat,
                    waited_ns: waited,
                });
            }
        }
        threads.sort_by(|a, b| a.label.cmp(&b.label));
        ThreadCpu {
            threads,
            at: Instant::now(),
        }
    }

    /// Each thread's share of the time since the last look (threads that
    /// have exited are left out).
    pub fn shares(&mut self) -> Vec<Share> {
        let now = Instant::now();
        let wall = now.duration_since(self.at).as_nanos().max(1) as f64;
        self.at = now;
        let mut out = Vec::new();
        for t in &mut self.threads {
            let Some(waited) = std::fs::read_to_string(&t.schedstat)
                .ok()
                .and_then(|s| waited_ns(&s))
            else {
                continue;
            };
            let d = waited.saturating_sub(t.waited_ns) as f64;
            t.waited_ns = waited;
            out.push(Share {
                label: t.label.clone(),
                waited: (d / wall).min(1.0),
            });
        }
        out
    }
}

/// The note for a status line or the summary when polling threads
/// waited [`STARVED`] or more of `span` for their cores: which ones, how
/// long, and what it means.
pub fn starved_note(shares: &[Share], span: &str) -> Option<String> {
    let who: Vec<String> = shares
        .iter()
        .filter(|s| s.waited >= STARVED)
        .map(|s| format!("{} waited {:.0}%", s.label, s.waited * 100.0))
        .collect();
    if who.is_empty() {
        return None;
    }
    Some(format!(
        "{} of {span} for its core, held by other processes: the I/O figures are low",
        who.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(label: &str, waited: f64) -> Share {
        Share {
            label: label.into(),
            waited,
        }
    }

    #[test]
    fn names_of_polling_threads() {
        assert_eq!(
            label_of("bdevperf-3", "bdevperf").as_deref(),
            Some("the worker on core 3")
        );
        assert_eq!(
            label_of("softnvme", "bdevperf").as_deref(),
            Some("the emulated controller's thread")
        );
        assert_eq!(label_of("bdevperf", "bdevperf"), None);
        assert_eq!(label_of("pollux-rt-signals", "bdevperf"), None);
        assert_eq!(waited_ns("123456 789 10\n"), Some(789));
        assert_eq!(waited_ns("123456"), None);
    }

    #[test]
    fn threads_held_off_their_cores_are_named() {
        let shares = [
            s("the emulated controller's thread", 0.1),
            s("the worker on core 0", 0.97),
        ];
        let n = starved_note(&shares, "this second").unwrap();
        assert_eq!(
            n,
            "the worker on core 0 waited 97% of this second for its core, held by other processes: the I/O figures are low"
        );
        let shares = [
            s("the emulated controller's thread", 0.8),
            s("the worker on core 1", 0.6),
        ];
        let n = starved_note(&shares, "the run").unwrap();
        assert!(n.starts_with("the emulated controller's thread waited 80%, the worker on core 1 waited 60% of the run"), "{n}");
    }

    #[test]
    fn no_note_when_the_threads_had_their_cores() {
        let shares = [
            s("the emulated controller's thread", 0.2),
            s("the worker on core 0", 0.49),
        ];
        assert_eq!(starved_note(&shares, "this second"), None);
        assert_eq!(starved_note(&[], "this second"), None);
    }

    /// A thread kept off its core by a busier one pinned there waits; a
    /// thread that sleeps does not.
    #[test]
    fn waits_for_the_core_are_measured() {
        let core = {
            // SAFETY: sched_getcpu has no preconditions.
            let c = unsafe { libc::sched_getcpu() };
            usize::try_from(c).unwrap_or(0)
        };
        let spin = |name: &str, ms: u64| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let _ = pollux_runtime::pin_to_core(core);
                    let end = Instant::now() + std::time::Duration::from_millis(ms);
                    let mut x = 0u64;
                    while Instant::now() < end {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
                .unwrap()
        };
        let sleeper = std::thread::Builder::new()
            .name("waittest-8".into())
            .spawn(|| std::thread::sleep(std::time::Duration::from_millis(400)))
            .unwrap();
        // Two spinners on one core: each waits about half the time.
        let a = spin("waittest-1", 400);
        let b = spin("waittest-2", 400);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let mut cpu = ThreadCpu::find("waittest");
        if cpu.threads.is_empty() {
            // No schedstat on this kernel: nothing to measure.
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let shares = cpu.shares();
        for t in [a, b, sleeper] {
            t.join().unwrap();
        }
        let of = |l: &str| shares.iter().find(|s| s.label == l).map(|s| s.waited);
        let (w1, w2) = (of("the worker on core 1"), of("the worker on core 2"));
        assert!(w1.unwrap() + w2.unwrap() > 0.5, "{shares:?}");
        assert!(of("the worker on core 8").unwrap() < 0.05, "{shares:?}");
    }
}
