//! Repeated errors, said once with a count (perf and bdevperf jobs).
//!
//! When a target goes away, every I/O in flight fails the same way: a job
//! at -q 128 would log 128 identical lines. [`ErrorLog`] logs the first
//! error of each kind (kinds: messages equal once their numbers are
//! masked, so "submit at LBA 8 failed: X" and "... LBA 9 ..." are one
//! kind), counts the repeats, and says how many there were at most once a
//! second and at the end of the run. Errors only: no cost per good I/O.
use std::time::{Duration, Instant};

/// Distinct kinds followed per job; errors of further kinds are counted by
/// the caller but not logged.
const MAX_KINDS: usize = 16;
/// Messages kept for the report (the first of each kind).
pub const MAX_KEPT: usize = 10;
/// Repeats are summarised at most this often.
const EVERY: Duration = Duration::from_secs(1);

struct Kind {
    /// The message with its digit runs masked.
    key: String,
    first: String,
    /// Where `first` sits in the caller's kept list, if it was kept.
    kept: Option<usize>,
    /// Occurrences in all, and since the last line about this kind.
    count: u64,
    pending: u64,
    /// Some repeat's text differed from `first` (in its numbers).
    varied: bool,
    said: Instant,
}

#[derive(Default)]
pub struct ErrorLog {
    kinds: Vec<Kind>,
}

fn key_of(msg: &str) -> String {
    let mut k = String::with_capacity(msg.len());
    let mut in_digits = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                k.push('#');
            }
            in_digits = true;
        } else {
            k.push(c);
            in_digits = false;
        }
    }
    k
}

impl Kind {
    fn repeats(&self, n: u64) -> String {
        if self.varied {
            format!("{} (and {n} more like it)", self.first)
        } else {
            format!("{} (repeated {n} more times)", self.first)
        }
    }
}

impl ErrorLog {
    /// One error of the job `label`: logged if it is the first of its kind
    /// (and then kept in `kept`, while it holds fewer than [`MAX_KEPT`]),
    /// else counted, with a line about the repeats if the last line about
    /// this kind is a second old.
    #[cold]
    pub fn error(&mut self, label: &str, msg: String, kept: &mut Vec<String>) {
        let key = key_of(&msg);
        if let Some(k) = self.kinds.iter_mut().find(|k| k.key == key) {
            k.count += 1;
            k.pending += 1;
            k.varied |= msg != k.first;
            let now = Instant::now();
            if now.duration_since(k.said) >= EVERY {
                tracing::error!("{label}: {}", k.repeats(k.pending));
                k.pending = 0;
                k.said = now;
            }
            return;
        }
        let kept_at = (kept.len() < MAX_KEPT).then(|| {
            kept.push(msg.clone());
            kept.len() - 1
        });
        if self.kinds.len() >= MAX_KINDS {
            if kept_at.is_some() {
                tracing::error!("{label}: {msg}");
            }
            return;
        }
        tracing::error!("{label}: {msg}");
        self.kinds.push(Kind {
            key,
            first: msg,
            kept: kept_at,
            count: 1,
            pending: 0,
            varied: false,
            said: Instant::now(),
        });
    }

    /// The end of the run: logs the repeats not yet said, and gives each
    /// kept message that repeated its count ("... (repeated 127 more
    /// times)").
    pub fn finish(&mut self, label: &str, kept: &mut [String]) {
        for k in &mut self.kinds {
            if k.pending > 0 {
                tracing::error!("{label}: {}", k.repeats(k.pending));
                k.pending = 0;
            }
            if let (true, Some(i)) = (k.count > 1, k.kept) {
                if let Some(m) = kept.get_mut(i) {
                    *m = k.repeats(k.count - 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_counted_not_kept() {
        let mut log = ErrorLog::default();
        let mut kept = Vec::new();
        for _ in 0..128 {
            log.error("job", "I/O failed: gone".into(), &mut kept);
        }
        for lba in 0..5 {
            log.error("job", format!("submit at LBA {lba} failed: X"), &mut kept);
        }
        assert_eq!(kept, ["I/O failed: gone", "submit at LBA 0 failed: X"]);
        log.finish("job", &mut kept);
        assert_eq!(
            kept,
            [
                "I/O failed: gone (repeated 127 more times)",
                "submit at LBA 0 failed: X (and 4 more like it)"
            ]
        );
    }

    #[test]
    fn many_kinds_keep_at_most_max_kept() {
        let mut log = ErrorLog::default();
        let mut kept = Vec::new();
        for i in 0..40 {
            log.error("job", format!("kind {}", "x".repeat(i)), &mut kept);
        }
        assert_eq!(kept.len(), MAX_KEPT);
        assert_eq!(key_of("a 12 b 3"), "a # b #");
    }
}
