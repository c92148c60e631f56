#!/usr/bin/env python3
"""QD 1, 4 KiB random read: polled vs interrupts, interleaved in one run.

    bench/irq.py [--bin target/release/pollux] [--pairs 5] [--secs 2] [-- PERF ARGS]

For each mode: IOPS, p50/p99/max latency and the worker's CPU use
(getrusage over the run), median and range over the pairs, with the
cross-core round trip (`pollux pingpong`) of the same run. Against the
emulated controller these are ratios of this machine, not device speeds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import round_trip  # noqa: E402  (bench/ab.py: the same round-trip probe)


def perf(binary, extra, args, secs):
    cmd = [binary, "perf", "--json", "-L", "-q", "1", "-o", "4096", "-w", "randread", "-t", str(secs)] + extra + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    t = json.loads(p.stdout)["total"]
    return {
        "iops": t["iops"],
        "p50": t["p50_lat_us"],
        "p99": t["p99_lat_us"],
        "max": t["max_lat_us"],
        "cpu": t["worker_cpu_util_max"] * 100,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/pollux")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--secs", type=int, default=2)
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    modes = [("polled", []), ("interrupts", ["--interrupts"])]
    res = {m: [] for m, _ in modes}
    rt0 = round_trip(a.bin)
    for i in range(a.pairs):
        order = modes if i % 2 == 0 else modes[::-1]
        for name, extra in order:
            res[name].append(perf(a.bin, extra, a.args, a.secs))
    rt1 = round_trip(a.bin)
    med = statistics.median
    print(f"QD 1 4 KiB randread, {a.pairs} interleaved pairs of {a.secs} s; perf args: {' '.join(a.args) or '(defaults)'}")
    print(f"{'':<12}{'IOPS':>22}{'p50 us':>20}{'p99 us':>20}{'max us':>24}{'CPU %':>20}")
    for name, _ in modes:
        cells = []
        for k, fmt in [("iops", "{:.0f}"), ("p50", "{:.2f}"), ("p99", "{:.2f}"), ("max", "{:.0f}"), ("cpu", "{:.1f}")]:
            xs = [r[k] for r in res[name]]
            cells.append(f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})")
        print(f"{name:<12}" + "".join(f"{c:>22}" for c in cells))
    r = [i["iops"] / p["iops"] for p, i in zip(res["polled"], res["interrupts"])]
    print(f"IOPS interrupts/polled median {med(r):.3f} (range {min(r):.3f}-{max(r):.3f})")
    print(f"cross-core round trip before {rt0} ns, after {rt1} ns; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
