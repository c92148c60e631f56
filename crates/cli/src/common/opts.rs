//! Options perf and bdevperf share, and their checks.

/// An option whose value cannot work, named with its value (if any) and
/// why: every tool refuses options with this error (`-q 0: must be at
/// least 1`, `--inline: ...`).
#[derive(Debug, thiserror::Error)]
#[error("{option}{}{value}: {why}", if value.is_empty() { "" } else { " " })]
pub struct BadOption {
    pub option: &'static str,
    pub value: String,
    pub why: String,
}

impl BadOption {
    pub fn new(
        option: &'static str,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        BadOption {
            option,
            value: value.to_string(),
            why: why.into(),
        }
    }
}

/// The checks `perf` and `bdevperf` share: I/O size (`-o`), how the run
/// ends (`--io-count`, `-t`) and the command timeout (`--timeout-ms`).
pub(crate) fn check_run_options(
    io_size: u64,
    io_count: Option<u64>,
    time: u64,
    timeout_ms: u64,
) -> Result<(), BadOption> {
    let bad = |o: &'static str, v: u64, why: String| Err(BadOption::new(o, v, why));
    if io_size == 0 || !io_size.is_multiple_of(512) || io_size > 64 << 20 {
        return bad(
            "-o",
            io_size,
            "the I/O size must be a non-zero multiple of 512, at most 64 MiB".into(),
        );
    }
    match io_count {
        Some(0) => return bad("--io-count", 0, "must be at least 1".into()),
        None if time == 0 => {
            return bad(
                "-t",
                0,
                "no time limit: give --io-count N to end the run after N I/Os".into(),
            )
        }
        _ => {}
    }
    if timeout_ms > MAX_TIMEOUT_MS {
        return bad(
            "--timeout-ms",
            timeout_ms,
            format!("at most {MAX_TIMEOUT_MS} (one day); 0 disables the command timeout"),
        );
    }
    Ok(())
}

/// Longest `--timeout-ms` (one day): a bound keeps every deadline derived
/// from it (`Instant + 2 x timeout`) far from overflow.
pub const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_option_names_the_option_and_its_value() {
        let e = BadOption::new("-q", 0, "must be at least 1");
        assert_eq!(e.to_string(), "-q 0: must be at least 1");
        let e = BadOption::new("--inline", "", "needs one core");
        assert_eq!(e.to_string(), "--inline: needs one core");
        let e = check_run_options(1000, None, 5, 0).expect_err("-o 1000");
        assert_eq!((e.option, e.value.as_str()), ("-o", "1000"));
    }
}
