//! `--help` of perf, bdevperf, target and pingpong lists every option with
//! its spelling and default: the options they share are declared once and
//! flattened into each tool, and none may get lost, renamed or change its
//! default on the way.
mod common;
use common::pollux;

/// Every option `pollux <cmd> --help` lists: its spelling (`-q,
/// --queue-depth`, `--json`, `-C`) and its default, if it shows one.
fn options(cmd: &str) -> Vec<(String, Option<String>)> {
    let (code, out, err) = pollux(&[cmd, "--help"]);
    assert_eq!(code, 0, "{cmd} --help: {err}");
    let mut opts: Vec<(String, String)> = Vec::new();
    for line in out.lines() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        // An option's line: `  -q, --queue-depth <Q>  text` or
        // `      --json  text`; its text may follow on the next lines.
        if t.starts_with('-') && (indent == 2 || indent == 6) {
            let spelling: Vec<&str> = t
                .split_whitespace()
                .take_while(|w| w.starts_with('-'))
                .map(|w| w.trim_end_matches(','))
                .collect();
            opts.push((spelling.join(", "), t.to_string()));
        } else if let Some((_, text)) = opts.last_mut() {
            text.push(' ');
            text.push_str(t);
        }
    }
    opts.into_iter()
        .map(|(spelling, text)| {
            let default = text
                .split_once("[default: ")
                .map(|(_, d)| d.split_once(']').map_or(d, |(d, _)| d).trim().to_string());
            (spelling, default)
        })
        .collect()
}

/// `cmd --help` lists exactly `want` (spelling, default), in any order.
fn lists_exactly(cmd: &str, want: &[(&str, Option<&str>)]) {
    let mut got = options(cmd);
    got.sort();
    let mut want: Vec<(String, Option<String>)> = want
        .iter()
        .map(|(s, d)| (s.to_string(), d.map(str::to_string)))
        .collect();
    want.push(("-h, --help".into(), None));
    want.sort();
    for w in &want {
        assert!(got.contains(w), "{cmd} --help lacks {w:?}: {got:?}");
    }
    for g in &got {
        assert!(want.contains(g), "{cmd} --help lists {g:?}, not expected");
    }
}

/// Options perf and bdevperf both have.
const SHARED: &[(&str, Option<&str>)] = &[
    ("-q, --queue-depth", Some("128")),
    ("-o, --io-size", Some("4096")),
    ("-w, --workload", Some("randread")),
    ("-M, --rwmixread", Some("50")),
    ("-t, --time", Some("5")),
    ("--io-count", None),
    // Countable: -L, -LL.
    ("-L, --latency...", None),
    ("--inline", None),
    ("--device-core", None),
    ("--verify", None),
    ("--json", None),
    ("--timeout-ms", Some("30000")),
];

#[test]
fn perf_help_lists_every_option() {
    let mut want = SHARED.to_vec();
    want.extend_from_slice(&[
        ("-c, --cores", Some("0")),
        ("-P, --qpairs", Some("1")),
        ("-r, --transport", None),
        ("--no-delayed-doorbell", None),
        ("--sq-batch", Some("1")),
        ("--no-lazy-cq", None),
        ("--prefetch", None),
        ("--nt-copy", None),
        ("--poll-mode", Some("polled")),
        ("--interrupts", None),
        ("--cq-line-batch", None),
        ("--no-shadow-doorbell", None),
        ("--multipath", None),
        ("--multipath-policy", Some("active_active")),
        ("--multipath-selector", Some("round_robin")),
    ]);
    lists_exactly("perf", &want);
}

#[test]
fn bdevperf_help_lists_every_option() {
    let mut want = SHARED.to_vec();
    want.extend_from_slice(&[
        ("-m, --cpumask", Some("0x1")),
        ("-c, --config", None),
        ("-C", None),
        ("-T, --bdev", None),
        ("--null", None),
        ("--ram", None),
        ("--uring", None),
        ("--iopoll", None),
        ("--uring-yield", Some("16")),
        ("--nvme", None),
        ("--multipath", None),
        ("--block-size", Some("512")),
        ("-r, --rpc-socket", Some("/var/tmp/pollux.sock")),
        ("--metrics", None),
    ]);
    lists_exactly("bdevperf", &want);
}

#[test]
fn target_help_lists_every_option() {
    lists_exactly(
        "target",
        &[
            ("--listen", None),
            ("--null", None),
            ("--ram", None),
            ("--uring", None),
            ("--nvme", None),
            ("--device-core", None),
            ("--block-size", Some("512")),
            ("--nqn", Some("nqn.2016-06.io.pollux:cnode1")),
            ("--ns-uuid", Some("derived from the serial number")),
            ("--cntlid-range", Some("1-65519")),
            ("--ana-state", None),
            ("--host", None),
            ("--dhchap-key", None),
            ("--dhchap-ctrl-key", None),
            ("--dhchap-digests", None),
            ("--dhchap-dhgroups", None),
            ("--dhchap-dh-threads", None),
            ("--serial", None),
            ("--model", None),
            ("-m, --cpumask", Some("0x1")),
            ("-c, --config", None),
            ("--in-capsule-data-size", Some("4096")),
            ("--max-queue-depth", Some("128")),
            ("--max-io-size", Some("131072")),
            ("--incoming-cpu", None),
            ("--no-epoll-idle", None),
            ("--no-direct-receive", None),
            ("--epoll-receive", None),
            ("--send-buffer", Some("0")),
            ("--num-shared-buffers", Some("511")),
            ("--sock-impl", Some("posix")),
            ("--no-uring-fixed-files", None),
            ("--uring-rx-buffers", Some("512")),
            ("--uring-rx-buffer-size", Some("16384")),
            ("--uring-zcopy-threshold", Some("0")),
            ("--uring-registered-buffers", Some("0")),
            ("--send-iov", Some("512")),
            ("--busy-poll", None),
            ("--idle-spin", Some("200")),
            ("--handshake-timeout", Some("10")),
            ("-r, --rpc-socket", Some("/var/tmp/pollux.sock")),
            ("--metrics", None),
        ],
    );
}

#[test]
fn pingpong_help_lists_every_option() {
    lists_exactly(
        "pingpong",
        &[
            ("-c, --cores", Some("0,1")),
            ("--trips", Some("200000")),
            ("--batches", Some("7")),
            ("--json", None),
        ],
    );
}

/// The first core this process may run on (`Cpus_allowed_list`).
fn first_core() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|l| l.trim().split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a core")
}

/// Every tool reads a core list (perf's and pingpong's `-c`, bdevperf's
/// and target's `-m`) in the same forms, SPDK's (`0x3`, `[0,1]`, `0-1`,
/// `0,2`), and refuses a bad one in the same words. Before, perf and
/// pingpong refused the bracket form.
#[test]
fn every_tool_reads_core_lists_alike() {
    let one = format!("[{}]", first_core());
    let runs: [&[&str]; 2] = [
        &["perf", "--inline", "-c", &one],
        &["bdevperf", "--null", "-m", &one],
    ];
    for args in runs {
        let mut args = args.to_vec();
        args.extend_from_slice(&["-t", "0", "--io-count", "100", "--json"]);
        let (code, out, err) = pollux(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["total"]["ios"], 100, "{args:?}: {out}");
    }
    let tools = [
        ("perf", "-c"),
        ("bdevperf", "-m"),
        ("target", "-m"),
        ("pingpong", "-c"),
    ];
    let bad = [
        ("[0,1", "unbalanced brackets in '[0,1'"),
        ("0x0", "no cores in '0x0'"),
        ("3-1", "bad core range '3-1'"),
        ("two", "bad core 'two'"),
    ];
    for (tool, opt) in tools {
        for (v, why) in bad {
            let (code, out, err) = pollux(&[tool, opt, v]);
            assert_eq!(code, 2, "{tool} {opt} {v}: {out}{err}");
            let want = format!("pollux {tool}: {opt} {v}: {why}\n");
            assert_eq!(err, want, "{tool} {opt} {v}");
        }
    }
}

/// The cores this process may run on (`Cpus_allowed_list`: `0-3,6`).
fn allowed_cores() -> Vec<usize> {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list");
    let mut cores = Vec::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cores.extend(a.parse::<usize>().expect("core")..=b.parse().expect("core"));
    }
    cores
}

/// The message of a refused run of `pollux <args>`, without the tool's
/// prefix.
fn refusal(args: &[&str]) -> String {
    let (code, out, err) = pollux(args);
    assert_eq!(code, 2, "{args:?}: {out}{err}");
    assert!(out.is_empty(), "{args:?}: no run: {out}");
    let prefix = format!("pollux {}: ", args[0]);
    err.strip_prefix(&prefix)
        .or_else(|| err.lines().next())
        .unwrap_or(&err)
        .trim_end()
        .to_string()
}

/// perf and bdevperf check the options they share (declared once) alike:
/// the same message, naming the option and its value. Before, `-q 0` was
/// "must be at least 1" in perf and "must be in 1..=65535" in bdevperf,
/// and `--inline` on two cores two different sentences; then `-q 100000`
/// said "not in 0..=65535" while 0 was refused: the range stated is now
/// the one accepted.
#[test]
fn perf_and_bdevperf_refuse_shared_options_alike() {
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-q", "0"],
            "error: invalid value '0' for '--queue-depth <QUEUE_DEPTH>': 0 is not in 1..=65535",
        ),
        (
            vec!["-q", "65536"],
            "error: invalid value '65536' for '--queue-depth <QUEUE_DEPTH>': 65536 is not in 1..=65535",
        ),
        (vec!["-o", "1000"], "-o 1000: the I/O size must be"),
        (vec!["-t", "0"], "-t 0: no time limit"),
        (vec!["--io-count", "0"], "--io-count 0: must be at least 1"),
        (
            vec!["--timeout-ms", "86400001"],
            "--timeout-ms 86400001: at most",
        ),
        (
            vec!["--device-core", "1023"],
            "--device-core 1023: core 1023 is not available",
        ),
        (
            vec!["-M", "101"],
            "error: invalid value '101' for '--rwmixread <RWMIXREAD>'",
        ),
    ];
    for (args, want) in &cases {
        let mut p = vec!["perf"];
        p.extend_from_slice(args);
        let mut b = vec!["bdevperf", "--null"];
        b.extend_from_slice(args);
        let (perf, bdevperf) = (refusal(&p), refusal(&b));
        assert!(perf.starts_with(want), "perf {args:?}: {perf}");
        assert_eq!(perf, bdevperf, "{args:?}");
    }
    // --inline needs one worker core: each tool names its own core option.
    let cores = allowed_cores();
    if cores.len() >= 2 {
        let two = format!("{},{}", cores[0], cores[1]);
        let perf = refusal(&["perf", "--inline", "-c", &two]);
        let bdevperf = refusal(&["bdevperf", "--nvme", "trtype:soft", "--inline", "-m", &two]);
        assert!(
            perf.starts_with("--inline: ")
                && perf.contains(&format!("-c must name exactly one worker core (got {two})")),
            "{perf}"
        );
        assert_eq!(perf.replace("-c must", "-m must"), bdevperf);
    }
}

/// The subcommands `pollux <path> --help` lists under "Commands:".
fn subcommands(path: &[&str]) -> Vec<String> {
    let mut args = path.to_vec();
    args.push("--help");
    let (code, out, err) = pollux(&args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out.split_once("Commands:\n")
        .map(|(_, rest)| {
            rest.lines()
                .take_while(|l| l.starts_with("  "))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|c| *c != "help")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Every (sub)command's `--help` is its `-h`: one compact layout
/// everywhere. Before, bdevperf's `--help` switched to clap's long layout
/// (a blank line after every option) because one workload value had its
/// own help text, while perf's and target's did not.
#[test]
fn every_subcommand_has_one_help_layout() {
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    let mut seen = Vec::new();
    while let Some(path) = todo.pop() {
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        let run = |flag: &str| {
            let mut a = p.clone();
            a.push(flag);
            let (code, out, err) = pollux(&a);
            assert_eq!(code, 0, "{a:?}: {err}");
            out
        };
        assert_eq!(
            run("-h"),
            run("--help"),
            "pollux {p:?}: --help differs from -h"
        );
        for c in subcommands(&p) {
            let mut next = path.clone();
            next.push(c);
            todo.push(next);
        }
        seen.push(path.join(" "));
    }
    for want in [
        "perf",
        "bdevperf",
        "target",
        "discover",
        "setup",
        "setup bind",
        "pingpong",
    ] {
        assert!(
            seen.iter().any(|s| s == want),
            "{want} not walked: {seen:?}"
        );
    }
}

/// `-r`, bdevperf's and target's `--nvme` list every transport-ID key the
/// parser takes (before: `mdts`, `mqes`, `sqflow`, `ctrl_loss_tmo`, ... were
/// missing), and each key listed is one the parser takes.
#[test]
fn the_transport_id_help_lists_every_key() {
    let keys = [
        (
            "soft",
            "backend:ram size:1MiB lbads:512 ns:1 mdts:5 mqes:127 path:x",
        ),
        ("pcie", "traddr:ffff:ff:1f.7"),
        (
            "tcp",
            "traddr:127.0.0.1 adrfam:ipv4 trsvcid:1 subnqn:nqn.2016-06.io.a:b \
             hostnqn:nqn.2016-06.io.a:h hdgst:1 ddgst:1 sqflow:1 ctrl_loss_tmo:5 \
             reconnect_delay:1 fast_io_fail_tmo:-1",
        ),
    ];
    for (tool, option) in [("perf", "-r"), ("bdevperf", "--nvme"), ("target", "--nvme")] {
        let (_, help, _) = pollux(&[tool, "--help"]);
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for (trtype, kv) in keys {
            assert!(
                help.contains(&format!("trtype:{trtype}")),
                "{tool} {option}: trtype:{trtype}"
            );
            for pair in kv.split_whitespace() {
                let key = pair.split(':').next().unwrap_or(pair);
                assert!(
                    help.contains(&format!(" {key}:")) || help.contains(&format!("[{key}:")),
                    "{tool} {option} does not list {key}: {help}"
                );
            }
        }
    }
    // Each key above is one the parser takes: an unknown key is refused
    // naming it (`perf` parses every -r before opening anything).
    let (code, _, err) = pollux(&["perf", "-r", "trtype:soft colour:blue"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("key 'colour' is not valid for trtype:soft"),
        "{err}"
    );
    for (trtype, kv) in keys {
        let trid = format!("trtype:{trtype} {kv}");
        let (_, _, err) = pollux(&["perf", "-r", &trid, "-t", "1", "--io-count", "1"]);
        assert!(!err.contains("is not valid for trtype"), "{trid}: {err}");
    }
}

/// Log lines carry colour codes only on a terminal, and never with
/// `NO_COLOR` set (<https://no-color.org>). `script` (util-linux) gives
/// the run a terminal.
#[test]
fn log_colour_only_on_a_terminal_and_never_with_no_color() {
    let bin = env!("CARGO_BIN_EXE_pollux");
    let cmd = format!("{bin} perf --io-count 10 -t 0 --json");
    let run = |no_color: Option<&str>, terminal: bool| -> String {
        let mut c = if terminal {
            let mut c = std::process::Command::new("script");
            c.args(["-qec", &cmd, "/dev/null"]);
            c
        } else {
            let mut c = std::process::Command::new(bin);
            c.args(["perf", "--io-count", "10", "-t", "0", "--json"]);
            c
        };
        c.env("POLLUX_LOG", "info").env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        let o = c
            .output()
            .expect("run (script from util-linux for a terminal)");
        assert!(o.status.success(), "{o:?}");
        // On a terminal stdout and stderr are the one terminal.
        let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("controller ready"), "no log line: {text}");
        text
    };
    assert!(run(None, true).contains('\x1b'), "a terminal gets colour");
    assert!(!run(Some("1"), true).contains('\x1b'), "NO_COLOR=1");
    assert!(!run(None, false).contains('\x1b'), "a pipe gets none");
}

/// `-M` with a workload that mixes nothing is not silently ignored.
#[test]
fn rwmixread_without_a_mixed_workload_is_warned_about() {
    for tool in [&["perf"][..], &["bdevperf", "--null"][..]] {
        let mut a = tool.to_vec();
        a.extend_from_slice(&["-M", "70", "-w", "randread", "-t", "0", "--io-count", "100"]);
        let (code, _, err) = pollux(&a);
        assert_eq!(code, 0, "{a:?}: {err}");
        assert!(
            err.contains("-M 70 is ignored: -w randread does not mix reads and writes"),
            "{a:?}: {err}"
        );
        let mut a = tool.to_vec();
        a.extend_from_slice(&["-M", "70", "-w", "randrw", "-t", "0", "--io-count", "100"]);
        let (code, _, err) = pollux(&a);
        assert_eq!(code, 0, "{a:?}: {err}");
        assert!(!err.contains("ignored"), "{a:?}: {err}");
    }
}

/// A RAM or null size below one block is most likely a size without its
/// unit: it is refused saying so, in bdevperf, target and an emulated
/// controller's `size:` alike (before: "not a non-zero multiple of the
/// block size 512", or "size_bytes 64 not a multiple of the LBA size").
#[test]
fn a_size_without_a_unit_below_one_block_is_refused_with_the_units() {
    for args in [
        &["bdevperf", "--ram", "64"][..],
        &["target", "--ram", "64"][..],
        &["target", "--null", "64"][..],
        &["perf", "-r", "trtype:soft backend:ram size:64"][..],
    ] {
        let (code, _, err) = pollux(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("64: 64 bytes is less than one block (512 bytes)")
                && err.contains("give a unit (k, M, G or T"),
            "{args:?}: {err}"
        );
    }
}

/// Options whose value 0 means nothing say the range they take.
#[test]
fn counts_refuse_zero_stating_the_range() {
    for (args, want) in [
        (&["perf", "-P", "0"][..], "0 is not in 1..=65535"),
        (&["perf", "--sq-batch", "0"][..], "0 is not in 1..=65535"),
        (&["perf", "-q", "100000"][..], "100000 is not in 1..=65535"),
        (
            &["target", "--max-queue-depth", "100000"][..],
            "100000 is not in 2..=4096",
        ),
        (
            &["target", "--max-queue-depth", "1"][..],
            "1 is not in 2..=4096",
        ),
    ] {
        let (code, _, err) = pollux(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn rpc_names_the_socket_it_cannot_reach_and_bad_params() {
    let (code, _, err) = pollux(&["rpc", "-s", "/nonexistent/pollux.sock", "rpc_get_methods"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot connect to /nonexistent/pollux.sock"),
        "{err}"
    );
    let (code, _, err) = pollux(&["rpc", "-s", "/nonexistent.sock", "x", "[1,2]"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("parameters \"[1,2]\": not a JSON object"),
        "{err}"
    );
}
