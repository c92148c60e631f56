#!/usr/bin/env python3
"""bench/bdev.py section 2 (bdevperf vs perf over the emulated NVMe
controller, null backend, device thread on core 1) for two pollux binaries,
interleaved in one run: per round, BEFORE's bdevperf and perf, then AFTER's.
Prints each binary's bdevperf/perf ratio, median and range, and the
cross-core round trip of the run. Ratios of this machine, not device speeds.

Usage: bench/bdev_before_after.py BEFORE AFTER [--rounds N] [--secs S]"""
import argparse
import importlib.util
import os
import statistics

spec = importlib.util.spec_from_file_location("bdev", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bdev.py"))
bdev = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bdev)

a = argparse.ArgumentParser()
a.add_argument("before")
a.add_argument("after")
a.add_argument("--rounds", type=int, default=7)
a.add_argument("--secs", type=int, default=3)
a = a.parse_args()
base = ["-q", "128", "-o", "4096", "-w", "randread"]
ratios = {"before": [], "after": []}
rts = []
for r in range(a.rounds):
    for w, b in (("before", a.before), ("after", a.after)):
        bdev.BIN = b
        bi = bdev.bdevperf(["--nvme", bdev.SOFT_NULL, "--device-core", "1", "-m", "0x1"] + base, a.secs)["iops"]
        pi = bdev.perf(["-r", bdev.SOFT_NULL, "-c", "0", "--device-core", "1"] + base, a.secs)["iops"]
        ratios[w].append(bi / pi)
        print(f"{r + 1} {w}: bdevperf {bdev.fmt(bi)} perf {bdev.fmt(pi)} ratio {bi / pi:.3f}", flush=True)
    rt = bdev.round_trip()
    if rt:
        rts.append(rt)
for w, xs in ratios.items():
    print(f"{w}: bdevperf/perf median {statistics.median(xs):.3f} (range {min(xs):.3f}-{max(xs):.3f}, n={len(xs)})")
if rts:
    print(f"cross-core round trip: median {statistics.median(rts):.0f} ns (range {min(rts):.0f}-{max(rts):.0f})")
