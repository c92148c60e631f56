#!/usr/bin/env python3
"""Interleaved A/B of `pollux perf` IOPS in one run: two binaries (old vs
new build), or one binary with and without extra flags.

    bench/ab.py --a OLD_BIN --b NEW_BIN [--pairs 5] [--secs 2] [-- PERF ARGS]
    bench/ab.py --b BIN --b-flags "--cq-line-batch" [--pairs 5] [-- PERF ARGS]

Prints each pair, the median B/A ratio with its range, doorbells per I/O of
each side, and the cross-core cache-line round trip measured in the same run
(`pollux pingpong`), since every threaded figure on these shared 2-vCPU
machines moves with it. Figures are ratios from one run, not speeds.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys


def perf(binary, flags, args, secs):
    cmd = [binary, "perf", "--json", "-t", str(secs)] + flags + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-1500:]}")
    t = json.loads(p.stdout)["total"]
    return t["iops"], t.get("sq_doorbells_per_io"), t.get("cq_doorbells_per_io")


def round_trip(binary):
    p = subprocess.run([binary, "pingpong", "--json"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None
    try:
        return json.loads(p.stdout).get("round_trip_ns")
    except json.JSONDecodeError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="binary A (default: same as B)")
    ap.add_argument("--b", required=True, help="binary B")
    ap.add_argument("--a-flags", default="")
    ap.add_argument("--b-flags", default="")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--secs", type=int, default=2)
    ap.add_argument("args", nargs="*", help="perf arguments for both sides (after --)")
    a = ap.parse_args()
    bin_a = a.a or a.b
    fa, fb = shlex.split(a.a_flags), shlex.split(a.b_flags)
    print(f"A: {bin_a} {a.a_flags}\nB: {a.b} {a.b_flags}\nperf args: {' '.join(a.args) or '(defaults)'}")
    rt0 = round_trip(a.b)
    ratios, ia, ib, dba, dbb = [], [], [], [], []
    for i in range(a.pairs):
        # Alternate which side goes first so drift does not favour one.
        order = [("A", bin_a, fa), ("B", a.b, fb)]
        if i % 2:
            order.reverse()
        res = {}
        for name, binary, flags in order:
            res[name] = perf(binary, flags, a.args, a.secs)
        ia.append(res["A"][0])
        ib.append(res["B"][0])
        dba.append(res["A"][1:])
        dbb.append(res["B"][1:])
        ratios.append(res["B"][0] / res["A"][0])
        print(f"  pair {i + 1}: A {res['A'][0] / 1e6:.2f}M  B {res['B'][0] / 1e6:.2f}M  B/A {ratios[-1]:.3f}")
    rt1 = round_trip(a.b)
    med = statistics.median
    print(f"median IOPS A {med(ia) / 1e6:.2f}M ({min(ia) / 1e6:.2f}-{max(ia) / 1e6:.2f}), "
          f"B {med(ib) / 1e6:.2f}M ({min(ib) / 1e6:.2f}-{max(ib) / 1e6:.2f})")
    print(f"B/A median {med(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) over {a.pairs} interleaved pairs")
    print(f"doorbells/IO (SQ, CQ): A {dba[-1]}  B {dbb[-1]}")
    print(f"cross-core round trip (pingpong) before {rt0} ns, after {rt1} ns; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
