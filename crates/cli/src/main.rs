//! `pollux` — command-line tools of the pollux NVMe stack.
use clap::{CommandFactory, FromArgMatches, Subcommand};

mod bdevperf;
mod common;
mod discover;
mod emulator;
mod metrics;
mod nvme_open;
mod perf;
mod pingpong;
mod rpc;
mod rpc_client;
mod setup;
mod target;

#[derive(clap::Parser)]
#[command(
    name = "pollux",
    version,
    about = "pollux: user-space poll-mode NVMe tools",
    after_help = "Logs go to stderr, at warn and above by default; POLLUX_LOG sets the \
level per module as RUST_LOG does (POLLUX_LOG=info, or \
POLLUX_LOG=warn,pollux_nvmf=debug). Colour only when stderr is a terminal and \
NO_COLOR is unset."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure IOPS, bandwidth and latency (modelled on SPDK's nvme perf).
    Perf(perf::PerfArgs),
    /// Benchmark block devices (modelled on SPDK's bdevperf).
    Bdevperf(bdevperf::BdevperfArgs),
    /// Read the Discovery Log Page of an NVMe/TCP discovery controller.
    Discover(discover::DiscoverArgs),
    /// Hand NVMe controllers to user space (vfio-pci / uio_pci_generic) and back.
    Setup {
        #[command(subcommand)]
        cmd: setup::SetupCommand,
    },
    /// Serve bdevs over NVMe/TCP (an NVMe-oF target, modelled on SPDK's nvmf_tgt).
    Target(Box<target::TargetArgs>),
    /// Measure the cross-core cache-line round trip (the floor under QD 1 latency).
    Pingpong(pingpong::PingpongArgs),
    /// Call a JSON-RPC method of a running target or bdevperf (as SPDK's rpc.py does).
    Rpc(rpc_client::RpcArgs),
}

fn main() {
    let colour = log_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR"),
    );
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POLLUX_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    let m = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    // `pollux target`: each --dhchap-key goes to the --host before it.
    if let (Command::Target(a), Some(("target", tm))) = (&mut cli.cmd, m.subcommand()) {
        a.dhchap.record_order(tm);
    }
    let code = match cli.cmd {
        Command::Perf(args) => match perf::run(args) {
            Ok(report) => {
                if report.errors > 0 {
                    1
                } else {
                    0
                }
            }
            Err(e) => {
                eprintln!("pollux perf: {e}");
                2
            }
        },
        Command::Bdevperf(args) => match bdevperf::run(args) {
            Ok(s) => i32::from(s.errors > 0),
            Err(e) => {
                eprintln!("pollux bdevperf: {e}");
                2
            }
        },
        Command::Discover(args) => discover::main(args),
        Command::Setup { cmd } => match setup::run(cmd) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pollux setup: {e}");
                2
            }
        },
        Command::Target(args) => match target::run(*args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pollux target: {e}");
                2
            }
        },
        Command::Rpc(args) => rpc_client::main(args),
        Command::Pingpong(args) => match pingpong::run(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pollux pingpong: {e}");
                2
            }
        },
    };
    std::process::exit(code);
}

/// Whether log lines carry colour codes: only for a terminal (not a log
/// file or a pipe), and never when `NO_COLOR` is set to anything but the
/// empty string (<https://no-color.org>).
fn log_colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some("".into())));
        assert!(!log_colour(true, Some("1".into())));
        assert!(!log_colour(false, None));
        assert!(!log_colour(false, Some("1".into())));
    }
}
