#!/usr/bin/env python3
"""QD 1, 4 KiB random read: polled vs interrupts vs hybrid polling,
interleaved in one run.

    bench/irq.py [--bin target/release/pollux] [--rounds 5] [--secs 2]
                 [--modes polled,interrupts,hybrid] [-- PERF ARGS]
    bench/irq.py --guest [--bin STATIC_POLLUX] [--rounds 3] [--secs 2]

For each mode (`--interrupts` for interrupts, `--poll-mode hybrid` for
hybrid): IOPS, p50/p99/max latency, the worker's CPU use (getrusage over
the run, busiest worker) and its CPU time per I/O, median and range over
the rounds (each round runs every mode once, the order rotating), with the
cross-core round trip (`pollux pingpong`) before every round, and each
mode's p50 and CPU per I/O over polled's of the same round.

Against the emulated controller (the default, on its own device thread)
these are ratios of this machine, not device speeds. With `--guest` the
same rounds run inside one QEMU guest (tests/guest/run.sh, under `flock
/tmp/guest.lock`) against QEMU's NVMe controller bound to vfio-pci (MSI-X
interrupts through VFIO eventfds); `--bin` must then be a static build
(tests/guest/run-tests.sh shows how). Under TCG every figure is a ratio.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import round_trip  # noqa: E402  (bench/ab.py: the same round-trip probe)

FLAGS = {"polled": [], "interrupts": ["--interrupts"], "hybrid": ["--poll-mode", "hybrid"]}
BASE = ["--json", "-L", "-q", "1", "-o", "4096", "-w", "randread"]


def parse(out):
    v = json.loads(out)
    t = v["total"]
    cpu_s = sum(c["cpu_s"] for c in v["cores"])
    h = (t.get("hybrid") or [{}])[0]
    return {
        "iops": t["iops"],
        "p50": t["p50_lat_us"],
        "p99": t["p99_lat_us"],
        "max": t["max_lat_us"],
        "cpu": t["worker_cpu_util_max"] * 100,
        "cpu_io": cpu_s * 1e6 / max(t["ios"], 1),
        "sleeps": h.get("sleeps"),
        "skipped": h.get("skipped"),
        "sleep_cost_ns": h.get("sleep_cost_ns"),
        "min_sleep_ns": h.get("min_sleep_ns"),
    }


def perf(binary, mode, args, secs):
    cmd = [binary, "perf"] + BASE + ["-t", str(secs)] + FLAGS[mode] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    return parse(p.stdout)


def order(modes, i):
    k = i % len(modes)
    return modes[k:] + modes[:k]


def run_host(a, modes):
    rounds = []
    for i in range(a.rounds):
        r = {"rt": round_trip(a.bin)}
        for m in order(modes, i):
            r[m] = perf(a.bin, m, a.args, a.secs)
        rounds.append(r)
        print(f"  round {i + 1}: rt {r['rt']:.0f} ns  " + "  ".join(
            f"{m} p50 {r[m]['p50'] * 1000:.0f} ns cpu/io {r[m]['cpu_io'] * 1000:.0f} ns" for m in modes), flush=True)
    return rounds


def run_guest(a, modes):
    """Every round inside one guest: the commands print `@@ MODE` or `@@ rt`
    before each JSON line."""
    here = os.path.dirname(os.path.abspath(__file__))
    run_sh = os.path.join(here, "..", "tests", "guest", "run.sh")
    lines = [
        "P=/opt/pollux",
        "BDF=; for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/class)\" = 0x010802 ] && BDF=${d##*/}; done",
        "$P setup bind $BDF || exit 1",
        "TRID=\"trtype:pcie traddr:$BDF\"",
    ]
    for i in range(a.rounds):
        lines.append("echo '@@ rt'; $P pingpong --json --trips 20000 --batches 3")
        for m in order(modes, i):
            cmd = ["$P", "perf", "-r", "\"$TRID\""] + BASE + ["-t", str(a.secs)] + FLAGS[m] + [shlex.quote(x) for x in a.args]
            lines.append(f"echo '@@ {m}'; {' '.join(cmd)} || echo '@@ failed'")
    lines.append("$P setup reset")
    script = "\n".join(lines)
    cmd = ["flock", "/tmp/guest.lock", run_sh, "--timeout", "1500", "--extra-file", f"{os.path.abspath(a.bin)}:/opt/pollux", "--", script]
    print(f"guest: {' '.join(shlex.quote(c) for c in cmd[:-1])} <{len(lines)} lines>", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    rounds, cur, tag = [], None, None
    for line in p.stdout.splitlines():
        m = re.match(r"@@ (\S+)", line)
        if m:
            tag = m.group(1)
            if tag == "failed":
                sys.exit(f"a guest perf run failed:\n{p.stdout[-3000:]}")
            if tag == "rt":
                cur = {}
                rounds.append(cur)
            continue
        if tag and line.startswith("{"):
            if tag == "rt":
                cur["rt"] = json.loads(line).get("round_trip_ns")
            else:
                cur[tag] = parse(line)
            tag = None
    if p.returncode != 0 or not rounds or any(len(r) != len(modes) + 1 for r in rounds):
        sys.exit(f"guest run failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-1500:]}")
    for i, r in enumerate(rounds):
        print(f"  round {i + 1}: rt {r['rt']:.0f} ns  " + "  ".join(
            f"{m} p50 {r[m]['p50']:.1f} us cpu/io {r[m]['cpu_io']:.1f} us" for m in modes), flush=True)
    return rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/pollux")
    ap.add_argument("--rounds", "--pairs", type=int, default=5)
    ap.add_argument("--secs", type=int, default=2)
    ap.add_argument("--modes", default="polled,interrupts,hybrid")
    ap.add_argument("--guest", action="store_true", help="run inside a QEMU guest against QEMU's NVMe controller")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    modes = a.modes.split(",")
    for m in modes:
        if m not in FLAGS:
            sys.exit(f"--modes: unknown mode {m} (polled, interrupts, hybrid)")
    rounds = run_guest(a, modes) if a.guest else run_host(a, modes)
    med = statistics.median
    where = "QEMU's NVMe controller in a TCG guest (vfio-pci)" if a.guest else "emulated controller"
    print(f"QD 1 4 KiB randread on the {where}, {a.rounds} interleaved rounds of {a.secs} s; perf args: {' '.join(a.args) or '(defaults)'}")
    cols = [("iops", "IOPS", "{:.0f}"), ("p50", "p50 us", "{:.2f}"), ("p99", "p99 us", "{:.2f}"),
            ("max", "max us", "{:.0f}"), ("cpu", "CPU %", "{:.1f}"), ("cpu_io", "CPU us/IO", "{:.3f}")]
    print(f"{'':<12}" + "".join(f"{h:>26}" for _, h, _ in cols))
    for m in modes:
        cells = []
        for k, _, fmt in cols:
            xs = [r[m][k] for r in rounds]
            cells.append(f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})")
        print(f"{m:<12}" + "".join(f"{c:>26}" for c in cells))
    if "polled" in modes:
        for m in modes:
            if m == "polled":
                continue
            for k, what in [("p50", "p50"), ("cpu_io", "CPU per I/O"), ("iops", "IOPS")]:
                q = [r[m][k] / r["polled"][k] for r in rounds]
                print(f"{m}/polled {what}: median {med(q):.3f} (range {min(q):.3f}-{max(q):.3f})")
    if "hybrid" in modes:
        h = rounds[-1]["hybrid"]
        print(f"hybrid, last round: {h['sleeps']} sleeps, {h['skipped']} skipped; a 1 ns sleep took {h['min_sleep_ns']} ns at start, "
              f"a sleep's overshoot {h['sleep_cost_ns']} ns at the end (moving average)")
    rts = [r["rt"] for r in rounds if r.get("rt")]
    if rts:
        print(f"cross-core round trip{' (in the guest)' if a.guest else ''}: median {med(rts):.0f} ns (range {min(rts):.0f}-{max(rts):.0f})")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
