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
    /// `/proc/self/task/<tid>`.
    dir: PathBuf,
    ran_ns: u64,
    waited_ns: u64,
}

/// The share of the time since the last look that a thread spent ready
/// to run but waiting for its core.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub label: String,
    pub waited: f64,
}

/// Time on a CPU and waiting on a run queue from a `schedstat` line
/// ("run_ns wait_ns slices").
fn schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// Whether a `stat` line says the thread is running or ready to run
/// (state `R`; the state follows the command name's closing parenthesis).
fn runnable(stat: &str) -> bool {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        == Some("R")
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
    /// The polling threads: the runtime's (`runtime_name`, `workers` of
    /// them) and the emulated controllers' device thread. A thread names
    /// itself once it runs, so this looks again for up to 200 ms until
    /// all `workers` are there. Empty where `/proc` has no schedstat (then
    /// no notes are made).
    pub fn find(runtime_name: &str, workers: usize) -> ThreadCpu {
        let deadline = Instant::now() + std::time::Duration::from_millis(200);
        loop {
            let found = Self::find_now(runtime_name);
            let n = found
                .threads
                .iter()
                .filter(|t| t.label.starts_with("the worker"))
                .count();
            if n >= workers || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The polling threads that have named themselves by now.
    fn find_now(runtime_name: &str) -> ThreadCpu {
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
                let Some((ran, waited)) = std::fs::read_to_string(p.join("schedstat"))
                    .ok()
                    .and_then(|t| schedstat(&t))
                else {
                    continue;
                };
                threads.push(Tracked {
                    label,
                    dir: p,
                    ran_ns: ran,
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

    /// Each thread's share of the time since the last look that it waited
    /// for its core (threads that have exited are left out): for a thread
    /// ready to run now, the time it did not run; for one asleep, what
    /// `schedstat` counted.
    pub fn shares(&mut self) -> Vec<Share> {
        let now = Instant::now();
        let wall = now.duration_since(self.at).as_nanos().max(1) as f64;
        self.at = now;
        let mut out = Vec::new();
        for t in &mut self.threads {
            let Some((ran, waited)) = std::fs::read_to_string(t.dir.join("schedstat"))
                .ok()
                .and_then(|s| schedstat(&s))
            else {
                continue;
            };
            let counted = waited.saturating_sub(t.waited_ns) as f64 / wall;
            let ran_share = ran.saturating_sub(t.ran_ns) as f64 / wall;
            (t.ran_ns, t.waited_ns) = (ran, waited);
            let ready = std::fs::read_to_string(t.dir.join("stat")).is_ok_and(|s| runnable(&s));
            // A polling thread ready to run now should have run all along:
            // what it did not run, it waited (schedstat counts such a wait
            // only once the thread is back on a CPU, in a later second).
            // One that sleeps now has had its waits counted.
            let waited = if ready { 1.0 - ran_share } else { counted };
            out.push(Share {
                label: t.label.clone(),
                waited: waited.clamp(0.0, 1.0),
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
        "{} of {span} for its core, other threads or processes held it: the I/O figures are low",
        who.join(", ")
    ))
}

/// The summary's notes: the run's polling threads waited [`STARVED`] or
/// more of it for their cores, or, if not over the whole run, in the
/// seconds `held` whose status lines said so.
pub fn run_notes(run: &[Share], held: &[u64]) -> Vec<String> {
    if let Some(n) = starved_note(run, "the run") {
        return vec![n];
    }
    if held.is_empty() {
        return Vec::new();
    }
    let secs: Vec<String> = held.iter().map(|s| format!("{s}s")).collect();
    vec![format!(
        "polling threads were held off their cores by other processes in the second(s) ending at {} \
         (the status lines name them): those seconds' I/O figures are low",
        secs.join(", ")
    )]
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
        assert_eq!(schedstat("123456 789 10\n"), Some((123456, 789)));
        assert_eq!(schedstat("123456"), None);
        assert!(runnable("42 (bdevperf-0) R 1 2 3"));
        assert!(runnable("42 (odd) name) R 1"));
        assert!(!runnable("42 (bdevperf-0) S 1 2 3"));
        assert!(!runnable("garbage"));
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
            "the worker on core 0 waited 97% of this second for its core, other threads or processes held it: the I/O figures are low"
        );
        let shares = [
            s("the emulated controller's thread", 0.8),
            s("the worker on core 1", 0.6),
        ];
        let n = starved_note(&shares, "the run").unwrap();
        assert!(n.starts_with("the emulated controller's thread waited 80%, the worker on core 1 waited 60% of the run"), "{n}");
    }

    #[test]
    fn the_summary_names_the_seconds_held() {
        let ok = [s("the worker on core 0", 0.2)];
        assert!(run_notes(&ok, &[]).is_empty());
        let n = run_notes(&ok, &[2, 3]);
        assert_eq!(n.len(), 1);
        assert!(n[0].contains("ending at 2s, 3s"), "{n:?}");
        let bad = [s("the worker on core 0", 0.9)];
        assert!(run_notes(&bad, &[1])[0].contains("waited 90% of the run"));
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
        let mut cpu = ThreadCpu::find("waittest", 3);
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
