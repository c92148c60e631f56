#!/usr/bin/env python3
"""pollux block-device layer and runtime benchmark (issue 7): one run,
ratios measured interleaved, with the cross-core round trip of the same run.

  1. Null bdev, one core, QD 128, 4 KiB randread (`pollux bdevperf --null`):
     N runs, median and range (target >= 25 M IOPS), beside the round trip.
  2. `pollux bdevperf` over the emulated NVMe controller vs `pollux perf` on
     the same controller (null backend, device thread on the other core),
     interleaved pairs: IOPS bdevperf/perf (target: loss <= 5%).
  3. Host instructions per I/O with callgrind, inline (deterministic):
     perf vs bdevperf over the same emulated controller, from the difference
     of two runs of different length (target: bdevperf adds <= 20).
  4. io_uring backend vs fio's io_uring engine on the same file, O_DIRECT,
     QD 32, 4 KiB randread, one core, interleaved pairs (target >= 1.0x).
  5. Idle CPU of a runtime with two threads and nothing to do (getrusage
     over 10 s; target < 1% of a core).
  6. The dynamic scheduler's effect: cores in use at low and high load.

Figures come from a shared 2-vCPU VM against an emulated controller: they
are ratios of this machine, not device speeds.

Usage: bench/bdev.sh [--quick] [--runs N] [--json FILE]
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
EXAMPLES = os.path.join(ROOT, "target", "release", "examples")
SOFT_NULL = "trtype:soft backend:null size:64GiB"


def run_json(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


_RPC = {}


def rpc_args(binary):
    """`-r PATH`, a JSON-RPC socket of this run's own (bdevperf serves one,
    by default on /var/tmp/pollux.sock, which another app may hold); none
    for a binary from before it served one (bdev_before_after.py)."""
    if binary not in _RPC:
        h = subprocess.run([binary, "bdevperf", "--help"], capture_output=True, text=True).stdout
        _RPC[binary] = "--rpc-socket" in h
    return ["-r", f"/tmp/pollux-bench-{os.getpid()}.sock"] if _RPC[binary] else []


def bdevperf(args, secs):
    return run_json([BIN, "bdevperf", "--json", "-t", str(secs)] + rpc_args(BIN) + args, secs + 120)["total"]


def perf(args, secs):
    return run_json([BIN, "perf", "--json", "-t", str(secs)] + args, secs + 120)["total"]


def round_trip():
    p = subprocess.run([BIN, "pingpong", "--json"], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(p.stdout).get("round_trip_ns")
    except json.JSONDecodeError:
        return None


def med_range(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(x):
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def callgrind_host(cmd, ios):
    """Total instructions minus the emulated controller's step() for one
    inline run of `ios` I/Os."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        full = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + cmd + ["--io-count", str(ios)]
        p = subprocess.run(full, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            sys.exit(f"callgrind run failed: {' '.join(full)}\n{p.stderr[-2000:]}")
        a = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                           capture_output=True, text=True).stdout
        total, step = None, 0
        for line in a.splitlines():
            m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?PROGRAM TOTALS", line)
            if m:
                total = int(m.group(1).replace(",", ""))
            m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\S*pollux_softnvme::\S*::step\b", line)
            if m:
                step = max(step, int(m.group(1).replace(",", "")))
        if total is None:
            sys.exit("could not parse callgrind_annotate output")
        return total - step


def per_io(cmd, lo, hi):
    return (callgrind_host(cmd, hi) - callgrind_host(cmd, lo)) / (hi - lo)


def fio(path, secs):
    cmd = ["fio", "--name=bench", f"--filename={path}", "--ioengine=io_uring", "--direct=1",
           "--rw=randread", "--bs=4k", "--iodepth=32", "--numjobs=1", "--cpus_allowed=0",
           f"--runtime={secs}", "--time_based", "--output-format=json"]
    out = run_json(cmd, secs + 120)
    return out["jobs"][0]["read"]["iops"]


URING_JOB = ["-q", "32", "-o", "4096", "-w", "randread", "-m", "0x1"]


def uring_vs_fio(path, pairs, secs, label):
    """pollux's io_uring bdev vs fio's io_uring engine, interleaved, the
    order alternating so neither always runs on a warmer cache."""
    print(f"== {label}. io_uring backend vs fio io_uring on {path}, O_DIRECT, QD 32, 4 KiB randread, core 0: {pairs} pairs x {secs} s")
    ratios, ub, uf = [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            u = bdevperf(["--uring", path] + URING_JOB, secs)["iops"]
            f = fio(path, secs)
        else:
            f = fio(path, secs)
            u = bdevperf(["--uring", path] + URING_JOB, secs)["iops"]
        ub.append(u)
        uf.append(f)
        ratios.append(u / f)
        print(f"   pollux uring {fmt(u)}  fio {fmt(f)}  ratio {u / f:.3f}")
    m, lo, hi = med_range(ratios)
    print(f"   pollux/fio median {m:.3f} (range {lo:.3f} .. {hi:.3f})   (target >= 1.0)")
    return {"median": m, "min": lo, "max": hi, "pollux": ub, "fio": uf, "file": path}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--file", help="file for the io_uring comparison (default: a 1 GiB file under /var/tmp)")
    a = ap.parse_args()
    secs = 1 if a.quick else 2
    runs = 2 if a.quick else a.runs
    pairs = 2 if a.quick else a.runs
    res = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
    rt0 = round_trip()
    print(f"cross-core round trip (pollux pingpong): {rt0} ns; load average {os.getloadavg()[0]:.2f}")

    print(f"== 1. null bdev, 1 core, QD 128, 4 KiB randread: {runs} runs x {secs} s")
    base = ["-q", "128", "-o", "4096", "-w", "randread", "-m", "0x1"]
    xs = [bdevperf(["--null"] + base, secs)["iops"] for _ in range(runs)]
    m, lo, hi = med_range(xs)
    print(f"   median {fmt(m)} IOPS, range {fmt(lo)} .. {fmt(hi)}   (target >= 25M; SPDK bdevperf here: 17.1M)")
    res["null_bdev"] = {"median": m, "min": lo, "max": hi, "runs": xs}

    print(f"== 2. bdevperf vs perf over the emulated NVMe controller (null), device on core 1: {pairs} pairs x {secs} s")
    ratios, pb, pp = [], [], []
    for _ in range(pairs):
        b = bdevperf(["--nvme", SOFT_NULL, "--device-core", "1"] + base, secs)["iops"]
        p = perf(["-r", SOFT_NULL, "-c", "0", "--device-core", "1", "-q", "128", "-o", "4096", "-w", "randread"], secs)["iops"]
        pb.append(b)
        pp.append(p)
        ratios.append(b / p)
        print(f"   bdevperf {fmt(b)}  perf {fmt(p)}  ratio {b / p:.3f}")
    m, lo, hi = med_range(ratios)
    print(f"   bdevperf/perf median {m:.3f} (range {lo:.3f} .. {hi:.3f})   (target >= 0.95)")
    res["bdevperf_vs_perf"] = {"median": m, "min": lo, "max": hi, "bdevperf": pb, "perf": pp}

    if shutil.which("valgrind"):
        lo_n, hi_n = (10000, 30000) if a.quick else (20000, 60000)
        print(f"== 3. host instructions per I/O, inline, QD 128 4 KiB randread, null controller (callgrind, {hi_n} - {lo_n} I/Os)")
        ip = per_io([BIN, "perf", "--json", "--inline", "-t", "0", "-q", "128", "-o", "4096", "-w", "randread"], lo_n, hi_n)
        ib = per_io([BIN, "bdevperf", "--json", "--inline", "-t", "0", "--nvme", SOFT_NULL] + rpc_args(BIN) + base,
                    lo_n, hi_n)
        print(f"   perf {ip:.1f}, bdevperf {ib:.1f}: the layer and its runtime add {ib - ip:.1f}   (target <= 20)")
        res["instr_per_io"] = {"perf": ip, "bdevperf": ib, "added": ib - ip}
    else:
        print("== 3. skipped: valgrind not installed")

    if shutil.which("fio"):
        path = a.file
        made = False
        if not path:
            path = "/var/tmp/pollux-bench-uring.dat"
            if not os.path.exists(path) or os.path.getsize(path) < (1 << 30):
                subprocess.run(["fio", "--name=fill", f"--filename={path}", "--size=1G", "--rw=write",
                                "--bs=1M", "--direct=1", "--output-format=terse"], check=True,
                               capture_output=True, timeout=600)
                made = True
        res["uring_vs_fio"] = uring_vs_fio(path, pairs, secs, "4")
        # The same where the CPU is the limit: a tmpfs file (O_DIRECT is a
        # copy from memory, which the kernel runs on an io-wq worker,
        # iou-wrk, bound to the submitting thread's core: seen in
        # /proc/PID/task at 91% of core 0 beside the poller's 9%).
        shm = "/dev/shm/pollux-bench-uring.dat"
        if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > (2 << 30):
            subprocess.run(["fio", "--name=fill", f"--filename={shm}", "--size=1G", "--rw=write",
                            "--bs=1M", "--output-format=terse"], check=True, capture_output=True, timeout=600)
            res["uring_vs_fio_tmpfs"] = uring_vs_fio(shm, pairs, secs, "4b")
            print(f"== 4c. the uring poller's yield (--uring-yield 16 vs 0) on {shm}: {pairs} pairs x {secs} s")
            ratios = []
            for _ in range(pairs):
                on = bdevperf(["--uring", shm] + URING_JOB + ["--uring-yield", "16"], secs)["iops"]
                off = bdevperf(["--uring", shm] + URING_JOB + ["--uring-yield", "0"], secs)["iops"]
                ratios.append(on / off)
                print(f"   yield {fmt(on)}  no yield {fmt(off)}  ratio {on / off:.3f}")
            m, lo, hi = med_range(ratios)
            print(f"   on/off median {m:.3f} (range {lo:.3f} .. {hi:.3f})")
            res["uring_yield_tmpfs"] = {"median": m, "min": lo, "max": hi}
            os.unlink(shm)
        if made and not a.file:
            os.unlink(path)
    else:
        print("== 4. skipped: fio not installed")

    idle_s = 3 if a.quick else 10
    print(f"== 5. idle CPU: runtime with 2 threads and nothing to do, {idle_s} s (getrusage)")
    p = subprocess.run([os.path.join(EXAMPLES, "idle_cpu"), str(idle_s), "0", "1"], capture_output=True, text=True, timeout=120)
    line = p.stdout.splitlines()[0] if p.stdout else p.stderr
    print(f"   {line}   (target < 1% of a core)")
    m = re.search(r"= ([\d.]+)% of one core", line)
    res["idle_cpu_pct"] = float(m.group(1)) if m else None

    phase = 2 if a.quick else 3
    print(f"== 6. dynamic scheduler: 2 threads, 4 movable pollers, low / high / low load, {phase} s phases")
    out = []
    for flags in ([], ["--no-scheduler"]):
        p = subprocess.run([os.path.join(EXAMPLES, "scheduler_load"), "--secs", str(phase)] + flags,
                           capture_output=True, text=True, timeout=120)
        cores = re.findall(r"phase (\w+)\s+[\d.]+ s: cores in use (\d) of (\d)", p.stdout)
        label = "no scheduler" if flags else "scheduler"
        print(f"   {label}: " + ", ".join(f"{ph} {c}/{n}" for ph, c, n in cores))
        out.append({"label": label, "phases": cores})
    res["scheduler"] = out

    rt1 = round_trip()
    print(f"cross-core round trip after: {rt1} ns; load average {os.getloadavg()[0]:.2f}")
    res["round_trip_ns"] = [rt0, rt1]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
