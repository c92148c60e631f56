#!/usr/bin/env python3
"""pollux hot-path benchmark: one run measures everything the core issue
asks for, as medians/ranges and ratios taken in the same run.

  1. IOPS, 4 KiB randread, QD 128, one worker, null emulated controller on
     its own pinned device thread: N runs, median and range.
  2. Each hot-path technique on vs off (interleaved pairs, ratio of medians).
  3. SQ/CQ doorbell writes per I/O at QD 128 (with and without shadow
     doorbells: with them the polling controller needs no MMIO).
  4. QD 1 latency (-L) vs the cross-core cache-line round trip.
  5. Instructions per I/O with callgrind in inline mode: host side (driver
     + perf loop) and the emulated controller's own cost, from the
     difference of two runs of different length (setup cancels out).

Usage: bench/run.sh [--quick] [--json out.json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "pollux")


def perf(args, secs):
    cmd = [BIN, "perf", "--json", "-t", str(secs)] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 120)
    if p.returncode != 0:
        sys.exit(f"perf failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout)["total"]


def med_range(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt_iops(x):
    return f"{x / 1e6:.2f}M"


def callgrind_instr(args, ios):
    """Total instructions and inclusive instructions of the emulated
    controller's step() for a perf --inline run of `ios` I/Os."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", BIN, "perf", "--json", "--inline",
               "-t", "0", "--io-count", str(ios)] + args
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            sys.exit(f"callgrind run failed: {p.stderr[-2000:]}")
        a = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], capture_output=True, text=True).stdout
        total = None
        step = 0
        for line in a.splitlines():
            m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?PROGRAM TOTALS", line)
            if m:
                total = int(m.group(1).replace(",", ""))
            m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\S*pollux_softnvme::\S*::step\b", line)
            if m:
                step = max(step, int(m.group(1).replace(",", "")))
        if total is None:
            sys.exit("could not parse callgrind_annotate output")
        return total, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter runs (for a smoke test)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    secs = 1 if a.quick else 3
    runs = 2 if a.quick else a.runs
    pairs = 1 if a.quick else 3
    ncpu = os.cpu_count() or 1
    res = {"machine": {"cpus": ncpu, "load_before": os.getloadavg()}}
    base = ["-q", "128", "-o", "4096", "-w", "randread", "-c", "0"]
    if ncpu < 2:
        print("note: one CPU: the device thread shares the worker's core; figures are not meaningful")

    print(f"== 1. IOPS, 4 KiB randread QD128, 1 worker (core 0), null controller on core 1: {runs} runs x {secs}s")
    iops = [perf(base, secs)["iops"] for _ in range(runs)]
    m, lo, hi = med_range(iops)
    print(f"   median {fmt_iops(m)} IOPS, range {fmt_iops(lo)} .. {fmt_iops(hi)}   (target >= 10M)")
    res["iops_qd128"] = {"median": m, "min": lo, "max": hi, "runs": iops}

    print(f"== 2. techniques on/off, interleaved, {pairs} pair(s) each, ratio = median(on)/median(off)")
    techniques = [
        ("delayed SQ doorbell", [], ["--no-delayed-doorbell"]),
        ("SQ doorbell batch 32", ["--sq-batch", "32"], []),
        ("lazy CQ doorbell", [], ["--no-lazy-cq"]),
        ("tracker prefetch", ["--prefetch"], []),
        ("non-temporal SQE copy", ["--nt-copy"], []),
        ("shadow doorbells", [], ["--no-shadow-doorbell"]),
        ("CQ line batch", ["--cq-line-batch"], []),
    ]
    res["techniques"] = {}
    for name, on, off in techniques:
        ons, offs = [], []
        for _ in range(pairs):
            ons.append(perf(base + on, secs)["iops"])
            offs.append(perf(base + off, secs)["iops"])
        r = statistics.median(ons) / statistics.median(offs)
        print(f"   {name:<24} on {fmt_iops(statistics.median(ons)):>7}  off {fmt_iops(statistics.median(offs)):>7}  ratio {r:.3f}")
        res["techniques"][name] = {"on": ons, "off": offs, "ratio": r}

    print("== 3. doorbell writes per I/O at QD128")
    res["doorbells"] = {}
    for name, extra in [("default (shadow on)", []), ("shadow off", ["--no-shadow-doorbell"]),
                        ("shadow off, sq-batch 32", ["--no-shadow-doorbell", "--sq-batch", "32"])]:
        t = perf(base + extra, secs)
        print(f"   {name:<26} SQ {t['sq_doorbells_per_io']:.4f}  CQ {t['cq_doorbells_per_io']:.4f}  shadow updates {t['shadow_updates_per_io']:.4f}   (target <= 0.05 each)")
        res["doorbells"][name] = {k: t[k] for k in ("sq_doorbells_per_io", "cq_doorbells_per_io", "shadow_updates_per_io", "iops")}

    print("== 4. QD1 latency vs cross-core cache-line round trip")
    p = subprocess.run([BIN, "pingpong", "-c", "0,1", "--json"], capture_output=True, text=True, timeout=300)
    rt = json.loads(p.stdout)["round_trip_ns"] if p.returncode == 0 else float("nan")
    lats = []
    for _ in range(runs):
        t = perf(["-q", "1", "-o", "4096", "-w", "randread", "-c", "0", "-L"], secs)
        lats.append(t["p50_lat_us"] * 1000)
    lm, llo, lhi = med_range(lats)
    print(f"   round trip {rt:.0f} ns; QD1 p50 latency median {lm:.0f} ns (range {llo:.0f}..{lhi:.0f}); ratio {lm / rt:.2f}   (target <= 1.5)")
    res["qd1"] = {"round_trip_ns": rt, "p50_ns": lats, "ratio": lm / rt}

    if shutil.which("valgrind") and shutil.which("callgrind_annotate"):
        n1, n2 = (20_000, 60_000) if a.quick else (100_000, 300_000)
        print(f"== 5. instructions per I/O (callgrind, --inline, 4 KiB randread QD128 null; runs of {n1} and {n2} I/Os)")
        rows = {}
        for name, extra in [("default", []), ("shadow off", ["--no-shadow-doorbell"])]:
            t1, s1 = callgrind_instr(["-q", "128", "-o", "4096", "-w", "randread"] + extra, n1)
            t2, s2 = callgrind_instr(["-q", "128", "-o", "4096", "-w", "randread"] + extra, n2)
            total = (t2 - t1) / (n2 - n1)
            dev = (s2 - s1) / (n2 - n1)
            host = total - dev
            print(f"   {name:<11} host (driver + perf loop) {host:.1f} instr/IO   emulated controller {dev:.1f} instr/IO   (host target <= 200)")
            rows[name] = {"host": host, "device": dev, "total": total}
        res["instructions"] = rows
    else:
        print("== 5. skipped: valgrind not installed (apt-get install valgrind)")
    print(f"== 6. QD1 4 KiB randread, polled vs interrupts, {runs} interleaved pairs (median, range)")
    modes = {"polled": [], "interrupts": []}
    for i in range(runs):
        order = [("polled", []), ("interrupts", ["--interrupts"])]
        for name, extra in (order if i % 2 == 0 else order[::-1]):
            modes[name].append(perf(["-q", "1", "-o", "4096", "-w", "randread", "-c", "0", "-L"] + extra, secs))
    res["qd1_interrupts"] = {}
    for name, ts in modes.items():
        row = {}
        cells = []
        for k, label, f in [("iops", "IOPS", "{:.0f}"), ("p50_lat_us", "p50 us", "{:.2f}"), ("p99_lat_us", "p99 us", "{:.2f}"),
                            ("max_lat_us", "max us", "{:.0f}"), ("worker_cpu_util_max", "CPU", "{:.2f}")]:
            xs = [t[k] for t in ts]
            m, lo, hi = med_range(xs)
            row[k] = {"median": m, "min": lo, "max": hi}
            cells.append(f"{label} {f.format(m)} ({f.format(lo)}..{f.format(hi)})")
        print(f"   {name:<11} " + "  ".join(cells))
        res["qd1_interrupts"][name] = row
    res["machine"]["load_after"] = os.getloadavg()
    print(f"load average before {res['machine']['load_before'][0]:.2f}, after {res['machine']['load_after'][0]:.2f} (2 vCPUs, shared machine)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
