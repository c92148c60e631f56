#!/usr/bin/env python3
"""QD 1 latency against the cross-core round trip, interleaved in one run.

    bench/qd1.py --b BIN [--a OLD_BIN] [--b-flags "..."] [--a-flags "..."]
                 [--rounds 7] [--secs 2] [-- PERF ARGS]

Each round measures the cross-core cache-line round trip (`pollux
pingpong`, as bench/ab.py's `round_trip`) and then runs `pollux perf -q 1
-L` (4 KiB randread, emulated controller on its own device thread unless
PERF ARGS say otherwise) with each binary, alternating which goes first,
with a round trip between and after the runs. A run's ratio is its p50
over the mean of the round trips measured just before and just after it.
Prints each round and, per side, the median and range of p50 / round trip,
p50 and p99 (ns). Figures are ratios of this machine, not device speeds:
the round trip moves between ~50 and ~400 ns within minutes on these VMs.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import round_trip  # noqa: E402


def qd1(binary, flags, args, secs):
    cmd = [binary, "perf", "--json", "-L", "-q", "1", "-o", "4096", "-w", "randread", "-t", str(secs)] + flags + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    t = json.loads(p.stdout)["total"]
    return {"p50": t["p50_lat_us"] * 1000, "p99": t["p99_lat_us"] * 1000, "iops": t["iops"]}


def rt(binary):
    v = round_trip(binary)
    if v is None:
        sys.exit(f"{binary} pingpong failed")
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="binary A (optional: without it only B runs)")
    ap.add_argument("--b", required=True, help="binary B")
    ap.add_argument("--a-flags", default="")
    ap.add_argument("--b-flags", default="")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--secs", type=int, default=2)
    ap.add_argument("args", nargs="*", help="perf arguments for both sides (after --)")
    a = ap.parse_args()
    sides = [("B", a.b, shlex.split(a.b_flags))]
    if a.a or a.a_flags:
        sides.insert(0, ("A", a.a or a.b, shlex.split(a.a_flags)))
    for name, b, f in sides:
        print(f"{name}: {b} {' '.join(f)}")
    print(f"perf args: -q 1 -L -o 4096 -w randread -t {a.secs} {' '.join(a.args)}")
    res = {name: [] for name, _, _ in sides}
    for i in range(a.rounds):
        order = sides if i % 2 == 0 else sides[::-1]
        before = rt(a.b)
        line = []
        for name, binary, flags in order:
            r = qd1(binary, flags, a.args, a.secs)
            after = rt(a.b)
            r["rt"] = (before + after) / 2
            r["ratio"] = r["p50"] / r["rt"]
            res[name].append(r)
            line.append(f"{name} p50 {r['p50']:.0f} ns p99 {r['p99']:.0f} ns rt {r['rt']:.0f} ns p50/rt {r['ratio']:.2f}")
            before = after
        print(f"  round {i + 1}: " + "  |  ".join(line), flush=True)
    med = statistics.median

    def cell(xs, fmt):
        return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    for name, _, _ in sides:
        rs = res[name]
        print(f"{name}: p50/rt {cell([r['ratio'] for r in rs], '{:.2f}')}  p50 ns {cell([r['p50'] for r in rs], '{:.0f}')}"
              f"  p99 ns {cell([r['p99'] for r in rs], '{:.0f}')}  rt ns {cell([r['rt'] for r in rs], '{:.0f}')}")
    if len(sides) == 2:
        q = [b["ratio"] / x["ratio"] for x, b in zip(res["A"], res["B"])]
        print(f"(B p50/rt) / (A p50/rt) per round: median {med(q):.3f} (range {min(q):.3f}-{max(q):.3f}) over {a.rounds} rounds")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
