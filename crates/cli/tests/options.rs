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
        ("--interrupts", None),
        ("--cq-line-batch", None),
        ("--no-shadow-doorbell", None),
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
        ("--block-size", Some("512")),
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
            ("--host", None),
            ("--serial", None),
            ("--model", None),
            ("-m, --cpumask", Some("0x1")),
            ("-c, --config", None),
            ("--in-capsule-data-size", None),
            ("--max-queue-depth", None),
            ("--max-io-size", None),
            ("--incoming-cpu", None),
            ("--no-epoll-idle", None),
            ("--no-direct-receive", None),
            ("--num-shared-buffers", None),
            ("--send-iov", None),
            ("--handshake-timeout", None),
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
/// and `--inline` on two cores two different sentences.
#[test]
fn perf_and_bdevperf_refuse_shared_options_alike() {
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-q", "0"], "-q 0: must be at least 1"),
        (
            vec!["-q", "65536"],
            "error: invalid value '65536' for '--queue-depth <QUEUE_DEPTH>'",
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
