//! Options the tools share, declared once and flattened into each tool's
//! arguments (`#[command(flatten)]`), with their checks: [`RunArgs`] (perf
//! and bdevperf), [`DeviceCoreArgs`] (perf, bdevperf and target) and
//! [`CpumaskArgs`] (bdevperf and target). Every refusal is a [`BadOption`].

use clap::{Args, ValueEnum};
use pollux_host::trid::parse_size;

use super::cores::{check_cores, parse_cores};

/// What a benchmark run does, declared once for perf and bdevperf: one
/// job's queue depth, I/O size and pattern (`-q`, `-o`, `-w`, `-M`), when
/// the run ends (`-t`, `--io-count`), what it measures, checks and prints
/// (`-L`, `--verify`, `--json`), how emulated controllers run (`--inline`,
/// `--device-core`) and the command timeout (`--timeout-ms`). A job is
/// what keeps `-q` I/Os in flight: a queue pair in perf, a bdev channel in
/// bdevperf. `W`: the tool's workloads (bdevperf's add `verify`).
#[derive(Args, Debug, Clone)]
pub struct RunArgs<W: ValueEnum + Clone + Send + Sync + 'static> {
    /// Queue depth per job (a job: a queue pair in perf, one bdev on one
    /// core in bdevperf).
    #[arg(short = 'q', long = "queue-depth", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub queue_depth: u16,
    /// I/O size in bytes (suffixes k, m allowed).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_size)]
    pub io_size: u64,
    /// Workload pattern (bdevperf's verify: write each unit, read it back
    /// and compare, sequentially).
    #[arg(short = 'w', long = "workload", value_enum, default_value = "randread")]
    pub workload: W,
    /// Read percentage for rw/randrw [default: 50].
    #[arg(short = 'M', long = "rwmixread", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: Option<u8>,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 5)]
    pub time: u64,
    /// Stop after this many I/Os in total (split evenly over the jobs).
    #[arg(long = "io-count")]
    pub io_count: Option<u64>,
    /// Measure latency (reads the clock twice per I/O): -L average, min,
    /// max and p50/p90/p99/p99.9/p99.99 (reads and writes apart for rw and
    /// randrw); -LL also a histogram.
    #[arg(short = 'L', long = "latency", action = clap::ArgAction::Count)]
    pub latency: u8,
    /// Step the emulated NVMe controllers on the worker thread
    /// (deterministic; one worker core).
    #[arg(long)]
    pub inline: bool,
    #[command(flatten)]
    pub device: DeviceCoreArgs,
    /// Tag every written block and check every read.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// NVMe per-command timeout in milliseconds (0: none; at most one day).
    #[arg(long = "timeout-ms", default_value_t = 30_000)]
    pub timeout_ms: u64,
}

impl<W: ValueEnum + Clone + Send + Sync + 'static> RunArgs<W> {
    /// The checks that need no device: `-q`, `-o`, how the run ends
    /// (`--io-count`, `-t`), `--timeout-ms`, `--device-core` against
    /// `online` (the cores this process may run on) and `--inline` against
    /// the tool's worker cores `cores`, given as `cores_value` of option
    /// `cores_flag` (`-c 0`, `-m 0x1`).
    pub fn check(
        &self,
        online: &[usize],
        cores: &[usize],
        cores_flag: &str,
        cores_value: &str,
    ) -> Result<(), BadOption> {
        check_run_options(self.io_size, self.io_count, self.time, self.timeout_ms)?;
        self.device.check(online)?;
        if self.inline && cores.len() != 1 {
            return Err(BadOption::new(
                "--inline",
                "",
                format!(
                    "steps the emulated controllers on the worker thread: {cores_flag} must name exactly one worker core (got {cores_value})"
                ),
            ));
        }
        Ok(())
    }

    /// `-M`: the read percentage of a mixed workload (50 unless given).
    pub fn rwmixread(&self) -> u8 {
        self.rwmixread.unwrap_or(50)
    }

    /// What the options ask for that this run will not do, one line each
    /// (`-M` given with a workload that mixes nothing), for `tool` to warn
    /// about on stderr.
    pub fn ignored(&self) -> Vec<String> {
        let workload = self.workload.to_possible_value();
        let name = workload.as_ref().map_or("?", |v| v.get_name());
        let mut ignored = Vec::new();
        if let Some(m) = self.rwmixread {
            if name != "rw" && name != "randrw" {
                ignored.push(format!(
                    "-M {m} is ignored: -w {name} does not mix reads and writes (-w rw or randrw does)"
                ));
            }
        }
        ignored
    }

    /// The command timeout (`None`: `--timeout-ms 0`, none).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        (self.timeout_ms > 0).then(|| std::time::Duration::from_millis(self.timeout_ms))
    }
}

/// The transport-ID help of `perf -r`, `bdevperf --nvme` and `target
/// --nvme` (a literal, for `concat!`): every key that
/// `pollux_host::trid::parse` takes, by trtype.
macro_rules! trid_help {
    () => {
        "Transport ID in SPDK's key:value syntax. An emulated controller: \
'trtype:soft [backend:null|ram|file path:FILE size:1GiB lbads:512|4096 ns:N mdts:N \
mqes:N]'; a PCIe controller: 'trtype:pcie traddr:0000:01:00.0'; NVMe/TCP: \
'trtype:tcp traddr:IP [adrfam:ipv4|ipv6 trsvcid:4420 subnqn:NQN hostnqn:NQN \
hdgst:0|1 ddgst:0|1 sqflow:0|1 ctrl_loss_tmo:SECS reconnect_delay:SECS \
fast_io_fail_tmo:SECS busy_poll:US sock_impl:posix|uring uring_direct:0|1 uring_rx_buffers:N uring_rx_buffer_size:BYTES dhchap_key:PATH dhchap_ctrlr_key:PATH \
dhchap_digests:LIST dhchap_dhgroups:LIST]'"
    };
}
pub(crate) use trid_help;

/// `--device-core` (perf, bdevperf and target): where the emulated
/// controllers' device thread runs.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceCoreArgs {
    /// Core for the emulated controllers' device thread (trtype:soft;
    /// default: the first online core not among the tool's cores, -c or -m,
    /// if any).
    #[arg(long = "device-core")]
    pub device_core: Option<usize>,
}

impl DeviceCoreArgs {
    /// Refuses a core this process may not run on (`online`).
    pub fn check(&self, online: &[usize]) -> Result<(), BadOption> {
        match self.device_core {
            Some(c) => check_cores(&[c], online).map_err(|e| BadOption::new("--device-core", c, e)),
            None => Ok(()),
        }
    }

    /// The device thread's core: `--device-core`, else the first of
    /// `online` that is not one of the tool's `cores`, if any.
    pub fn core(&self, cores: &[usize], online: &[usize]) -> Option<usize> {
        self.device_core
            .or_else(|| online.iter().copied().find(|c| !cores.contains(c)))
    }
}

/// `-m` (bdevperf and target): the cores the tool's threads run on.
#[derive(Args, Debug, Clone)]
pub struct CpumaskArgs {
    /// Cores: a hex mask (0x3), a list ([0,1] or 0,1) or a range (0-1).
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    pub cpumask: String,
}

impl CpumaskArgs {
    /// The cores `-m` names, each one this process may run on (`online`).
    pub fn cores(&self, online: &[usize]) -> Result<Vec<usize>, BadOption> {
        cores_option("-m", &self.cpumask, online)
    }
}

/// The core list `value` of option `option` (`-c`, `-m`), parsed
/// ([`parse_cores`]) and checked against `online`, the cores this process
/// may run on; a refusal names the option and its value.
pub fn cores_option(
    option: &'static str,
    value: &str,
    online: &[usize],
) -> Result<Vec<usize>, BadOption> {
    let cores = parse_cores(value).map_err(|e| BadOption::new(option, value, e))?;
    check_cores(&cores, online).map_err(|e| BadOption::new(option, value, e))?;
    Ok(cores)
}

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

/// The blocks of a `--ram`/`--null` bdev (or an emulated namespace) of
/// `size` bytes and blocks of `block_size` bytes, set by `bs_option`
/// (`--block-size`, `lbads:`), or why there are none: a size below one
/// block is most likely a size given without its unit (`--ram 64`, bytes).
pub fn size_in_blocks(size: u64, block_size: u32, bs_option: &str) -> Result<u64, String> {
    let bs = u64::from(block_size);
    if bs == 0 {
        return Err(format!(
            "block size 0 ({bs_option}): a block has at least one byte"
        ));
    }
    if size < bs {
        return Err(format!(
            "{size} bytes is less than one block ({bs} bytes): a size without a unit is in bytes; \
             give a unit (k, M, G or T: 64M, 1GiB)"
        ));
    }
    if !size.is_multiple_of(bs) {
        // `--block-size 512`, `lbads:512`.
        let sep = if bs_option.ends_with(':') { "" } else { " " };
        return Err(format!("not a multiple of {bs_option}{sep}{bs}"));
    }
    Ok(size / bs)
}

/// I/O size (`-o`), how the run ends (`--io-count`, `-t`) and the command
/// timeout (`--timeout-ms`).
fn check_run_options(
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

    #[test]
    fn a_size_below_one_block_asks_for_a_unit() {
        assert_eq!(size_in_blocks(64 << 20, 512, "--block-size"), Ok(131072));
        let e = size_in_blocks(64, 512, "--block-size").unwrap_err();
        assert!(
            e.starts_with("64 bytes is less than one block (512 bytes)"),
            "{e}"
        );
        assert!(e.contains("give a unit (k, M, G or T"), "{e}");
        assert_eq!(
            size_in_blocks(1000, 512, "--block-size").unwrap_err(),
            "not a multiple of --block-size 512"
        );
        assert!(size_in_blocks(4096, 0, "--block-size").is_err());
        assert!(size_in_blocks(0, 512, "--block-size")
            .unwrap_err()
            .starts_with("0 bytes"));
        assert_eq!(
            size_in_blocks(1000, 4096, "lbads:").unwrap_err(),
            "1000 bytes is less than one block (4096 bytes): a size without a unit is in bytes; \
             give a unit (k, M, G or T: 64M, 1GiB)"
        );
        assert_eq!(
            size_in_blocks(5000, 4096, "lbads:").unwrap_err(),
            "not a multiple of lbads:4096"
        );
    }

    #[test]
    fn a_refused_core_list_names_the_option_and_its_value() {
        assert_eq!(cores_option("-m", "[0,1]", &[0, 1]).unwrap(), vec![0, 1]);
        let e = cores_option("-c", "[0,1", &[0, 1]).unwrap_err();
        assert_eq!(e.to_string(), "-c [0,1: unbalanced brackets in '[0,1'");
        let e = cores_option("-m", "0x4", &[0, 1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "-m 0x4: core 2 is not available to this process (available: 0-1)"
        );
    }
}
