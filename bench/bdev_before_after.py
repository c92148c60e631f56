#!/usr/bin/env python3
"""bench/bdev.py section 2 (bdevperf vs perf over the emulated NVMe
controller, null backend, device thread on core 1) for two pollux binaries,
interleaved in one run: per round, BEFORE's bdevperf and perf, then AFTER's
(the other way round in odd rounds; perf before bdevperf in every other
pair of rounds).
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
iops = {(w, t): [] for w in ratios for t in ("bdevperf", "perf")}
rts = []
for r in range(a.rounds):
    pair = (("before", a.before), ("after", a.after))
    for w, b in pair if r % 2 == 0 else pair[::-1]:
        bdev.BIN = b
        def run_b():
            return bdev.bdevperf(["--nvme", bdev.SOFT_NULL, "--device-core", "1", "-m", "0x1"] + base, a.secs)["iops"]

        def run_p():
            return bdev.perf(["-r", bdev.SOFT_NULL, "-c", "0", "--device-core", "1"] + base, a.secs)["iops"]

        if (r // 2) % 2 == 0:
            bi, pi = run_b(), run_p()
        else:
            pi, bi = run_p(), run_b()
        ratios[w].append(bi / pi)
        iops[(w, "bdevperf")].append(bi)
        iops[(w, "perf")].append(pi)
        print(f"{r + 1} {w}: bdevperf {bdev.fmt(bi)} perf {bdev.fmt(pi)} ratio {bi / pi:.3f}", flush=True)
    rt = bdev.round_trip()
    if rt:
        rts.append(rt)
for w, xs in ratios.items():
    print(f"{w}: bdevperf/perf median {statistics.median(xs):.3f} (range {min(xs):.3f}-{max(xs):.3f}, n={len(xs)})")
    for t in ("bdevperf", "perf"):
        v = iops[(w, t)]
        print(f"{w}: {t} median {bdev.fmt(statistics.median(v))} IOPS (range {bdev.fmt(min(v))}-{bdev.fmt(max(v))})")
if rts:
    print(f"cross-core round trip: median {statistics.median(rts):.0f} ns (range {min(rts):.0f}-{max(rts):.0f})")
