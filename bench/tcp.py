#!/usr/bin/env python3
"""NVMe/TCP figures of the issue, in one run, on loopback:

  1. `pollux target` pinned to one core (null bdev) and `pollux perf` over
     trtype:tcp on the other: 4 KiB randread QD 128, IOPS per target core,
     and how the target's time splits between the kernel (TCP) and user
     space (its utime/stime from /proc over the run); section 1d counts
     the target's user-space instructions per I/O with callgrind. Each
     run is followed by two bare-kernel bounds (1b): the same bytes one
     way only, and the same exchange both ways at QD 128 without NVMe.
  2. QD 1 4 KiB randread p50 latency (perf -L), each run beside the
     bare kernel's round trip of the same sizes (2b).
  3. The on/off ratio of each technique, interleaved: the host disabling
     SQ flow control (QD 128), the target's sendmsg batch (512 iovecs vs
     64, QD 128), the target's direct receive (128 KiB
     randwrite), epoll idle sleep (QD 1 latency) and SO_INCOMING_CPU (two target threads, two
     client threads).

Figures come from a shared 2-vCPU VM over loopback, where the client and
the target share the machine: they are ratios of this machine, not
network speeds. The cross-core round trip of the same run is printed.

Usage: bench/tcp.sh [--quick] [--runs N] [--json FILE]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "pollux")
BOUND = os.path.join(ROOT, "target", "release", "examples", "loopback_bound")
NQN = "nqn.2016-06.io.pollux:bench"
TICK = os.sysconf("SC_CLK_TCK")


def med_range(v):
    return statistics.median(v), min(v), max(v)


def fmt(x):
    return f"{x / 1e6:.3f} M" if x >= 1e6 else f"{x / 1e3:.1f} K"


def round_trip():
    p = subprocess.run([BIN, "pingpong", "--json"], capture_output=True, text=True, timeout=60)
    try:
        return round(json.loads(p.stdout)["round_trip_ns"])
    except (ValueError, KeyError):
        return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    """`pollux target` with a null namespace, for one measurement."""

    def __init__(self, mask="0x1", extra=(), prefix=()):
        self.port = free_port()
        self.p = subprocess.Popen(
            list(prefix) + [BIN, "target", "--listen", f"127.0.0.1:{self.port}", "--null", "64GiB", "--block-size",
                            "4096", "--nqn", NQN, "-m", mask, "--max-queue-depth", "256",
                            # A JSON-RPC socket of its own (the default may be held).
                            "-r", f"/tmp/pollux-bench-tcp-{os.getpid()}-{self.port}.sock"] + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + (120 if prefix else 20)
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.p.poll() is not None:
                sys.exit(f"pollux target exited: {self.p.stdout.read()}")
            time.sleep(0.05)
        sys.exit("pollux target did not listen in time")

    def trid(self):
        return f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{self.port} subnqn:{NQN}"

    def cpu(self):
        """(user, system) seconds of the target process so far."""
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) / TICK, int(fields[12]) / TICK

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def perf(trid, args, secs):
    cmd = [BIN, "perf", "-r", trid, "--json", "-t", str(secs)] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 120)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    if out["total"].get("errors", 0):
        sys.exit(f"I/O errors: {' '.join(cmd)}\n{out}")
    return out["total"]


def callgrind_target(ios):
    """Instructions the target executes in user space (callgrind's program
    total) while `pollux perf` on core 1 completes `ios` 4 KiB reads at
    QD 128, from start to shutdown."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        t = Target(prefix=["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"])
        try:
            perf(t.trid(), ["-c", "1", "-q", "128", "-o", "4096", "-w", "randread", "--io-count", str(ios)], 0)
        finally:
            t.stop()
        a = subprocess.run(["callgrind_annotate", "--threshold=100", out], capture_output=True, text=True).stdout
    for line in a.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    sys.exit("could not parse callgrind_annotate output")


def run(target_args, perf_args, secs, mask="0x1", host=""):
    t = Target(mask, target_args)
    try:
        u0, s0 = t.cpu()
        tot = perf((t.trid() + " " + host).strip(), perf_args, secs)
        u1, s1 = t.cpu()
    finally:
        t.stop()
    return tot, u1 - u0, s1 - s0


# Where a sample's time goes, by the first of these found on its call path
# (innermost first): the copy of payload bytes, the rest of a send, the
# rest of a receive, other kernel work, user space.
COPY = ("_copy_from_iter", "_copy_to_iter", "simple_copy_to_iter", "copy_user_generic", "rep_movs_alternative",
        "copy_user_enhanced_fast_string", "__memcpy")
SEND = ("__sys_sendmsg", "__sys_sendto", "do_writev")
RECV = ("__sys_recvfrom", "__sys_recvmsg", "do_readv")


def classify(stack):
    """stack: [(symbol, is_kernel)] innermost first."""
    if not stack:
        return "other"
    if not stack[0][1]:
        return "user"
    if any(sym in COPY for sym, _ in stack[:3]):
        return "copy"
    for sym, _ in stack:
        if sym in SEND:
            return "send"
        if sym in RECV:
            return "recv"
    return "kernel other"


def profile(pid_of, secs):
    """Samples the machine with `perf record -e cpu-clock -g` for `secs`
    (software clock: no hardware counters needed) and returns, for each
    process name in `pid_of` (name -> pid), the share of its samples per
    class of `classify`. None if perf is missing or refused."""
    if not shutil.which("perf"):
        return None
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-g", "-a", "-o", data,
                            "--", "sleep", str(secs)], capture_output=True, text=True, timeout=secs + 60)
        if p.returncode != 0:
            return None
        out = subprocess.run(["perf", "script", "-i", data, "-F", "pid,ip,sym,dso"],
                             capture_output=True, text=True, timeout=300).stdout
    want = {pid: name for name, pid in pid_of.items()}
    counts = {name: {} for name in pid_of}
    cur, stack = None, []

    def flush():
        if cur in want:
            c = counts[want[cur]]
            k = classify(stack)
            c[k] = c.get(k, 0) + 1

    for line in out.splitlines():
        if not line.strip():
            flush()
            cur, stack = None, []
        elif not line.startswith("\t"):
            flush()
            stack = []
            try:
                cur = int(line.split()[0])
            except ValueError:
                cur = None
        else:
            f = line.split()
            if len(f) >= 2:
                sym = f[1].split("+")[0]
                stack.append((sym, "kernel.kallsyms" in line))
    flush()
    res = {}
    for name, c in counts.items():
        n = sum(c.values())
        res[name] = {"samples": n, **{k: v / n for k, v in c.items()}} if n else {"samples": 0}
    return res


BOUND_BATCH = 128


def loopback_rtt(secs):
    p = subprocess.run([BOUND, "--rtt", "--secs", str(secs), "--json"], capture_output=True, text=True,
                       timeout=secs + 60)
    if p.returncode != 0:
        sys.exit(f"loopback_bound --rtt failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def loopback_closed_loop(secs):
    p = subprocess.run([BOUND, "--qd", "128", "--secs", str(secs), "--json"], capture_output=True, text=True,
                       timeout=secs + 60)
    if p.returncode != 0:
        sys.exit(f"loopback_bound --qd failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def loopback_bound(secs):
    # 128 PDUs per writev: what the target sends per call at QD 128.
    p = subprocess.run([BOUND, "--secs", str(secs), "--batch", str(BOUND_BATCH), "--json"], capture_output=True,
                       text=True, timeout=secs + 60)
    if p.returncode != 0:
        sys.exit(f"loopback_bound failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    secs = 1 if a.quick else 3
    runs = 2 if a.quick else a.runs
    res = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}}
    rt0 = round_trip()
    print(f"cross-core round trip (pollux pingpong): {rt0} ns; load average {os.getloadavg()[0]:.2f}")

    have_bound = os.path.exists(BOUND)
    print(f"== 1. target on core 0 (null bdev), perf on core 1 over TCP: 4 KiB randread QD 128, {runs} runs x {secs} s"
          + (", each followed by the two bare-kernel bounds (1b)" if have_bound else ""))
    iops, kern, user, bound, share, closed, cshare = [], [], [], [], [], [], []
    for _ in range(runs):
        tot, u, s = run([], ["-c", "1", "-q", "128", "-o", "4096", "-w", "randread"], secs)
        busy = u + s
        iops.append(tot["iops"])
        kern.append(s / busy if busy else 0.0)
        user.append(u / busy if busy else 0.0)
        line = f"   {fmt(tot['iops'])} IOPS; target CPU {busy / secs:.2f} cores: kernel {s:.2f} s, user {u:.2f} s"
        if have_bound:
            b = loopback_bound(secs)
            bound.append(b["pdus_per_s"])
            share.append(tot["iops"] / b["pdus_per_s"])
            line += f"; bare kernel {fmt(b['pdus_per_s'])} PDUs/s, target/bare {share[-1]:.2f}"
            c = loopback_closed_loop(secs)
            closed.append(c["ios_per_s"])
            cshare.append(tot["iops"] / c["ios_per_s"])
            line += f"; bare QD 128 {fmt(c['ios_per_s'])}/s, target/that {cshare[-1]:.2f}"
        print(line)
    m, lo, hi = med_range(iops)
    km = statistics.median(kern)
    print(f"   IOPS per target core: median {fmt(m)} (range {fmt(lo)} .. {fmt(hi)})   "
          f"(target >= 1.5 x SPDK's 684 K = 1.026 M); target time in the kernel {km * 100:.0f}%, user {100 - km * 100:.0f}%")
    res["qd128"] = {"median": m, "min": lo, "max": hi, "kernel_share": km, "runs": iops}
    if have_bound:
        bm, blo, bhi = med_range(bound)
        sm, slo, shi = med_range(share)
        print(f"== 1b. what the kernel alone moves over loopback (crates/nvmf/examples/loopback_bound.rs: a bare"
              f" polling sender on core 0 of 24 B + 4 KiB PDUs, {BOUND_BATCH} per writev, to a bare reader on core 1, no requests"
              f" the other way), interleaved with the runs above")
        print(f"   bare kernel median {fmt(bm)} PDUs/s (range {fmt(blo)} .. {fmt(bhi)}); target/bare median {sm:.2f}"
              f" (range {slo:.2f} .. {shi:.2f}); 1.026 M is {1.026e6 / bm:.2f} x the bare median")
        res["loopback_bound"] = {"median": bm, "min": blo, "max": bhi, "runs": bound,
                                 "target_share": {"median": sm, "min": slo, "max": shi}}
        cm, clo, chi = med_range(closed)
        qm, qlo, qhi = med_range(cshare)
        print(f"   the same exchange without NVMe (loopback_bound --qd 128: 72 B requests from a bare client on core 1,"
              f" 24 B + 4 KiB answers from a bare responder on core 0, up to 256 per writev, both polling):")
        print(f"   bare QD 128 median {fmt(cm)}/s (range {fmt(clo)} .. {fmt(chi)}); target/that median {qm:.2f}"
              f" (range {qlo:.2f} .. {qhi:.2f}); 1.026 M is {1.026e6 / cm:.2f} x its median;"
              f" {sum(x >= 1.026e6 for x in closed)} of {len(closed)} bare runs reached 1.026 M")
        res["loopback_closed_loop"] = {"median": cm, "min": clo, "max": chi, "runs": closed,
                                       "target_share": {"median": qm, "min": qlo, "max": qhi}}

    psecs = 2 if a.quick else 4
    print(f"== 1c. where the time goes at QD 128 (perf record -e cpu-clock -g, {psecs} s inside one {psecs + 3} s run)")
    t = Target()
    try:
        cmd = [BIN, "perf", "-r", t.trid(), "--json", "-t", str(psecs + 3), "-c", "1", "-q", "128", "-o", "4096",
               "-w", "randread"]
        cl = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        prof = profile({"target": t.p.pid, "client": cl.pid}, psecs)
        out, err = cl.communicate(timeout=psecs + 120)
    finally:
        t.stop()
    if prof is None:
        print("   skipped: perf missing or refused")
    else:
        try:
            got = fmt(json.loads(out)["total"]["iops"]) + " IOPS"
        except (ValueError, KeyError):
            got = "perf failed: " + err[-300:]
        print(f"   {got}")
        for name in ("target", "client"):
            r = prof[name]
            parts = ", ".join(f"{k} {r.get(k, 0) * 100:.0f}%"
                              for k in ("copy", "send", "recv", "kernel other", "user", "other"))
            print(f"   {name} ({r['samples']} samples): {parts}")
        print("   (copy: payload bytes copied by the kernel; send/recv: the rest of sendmsg/recv; a receive"
              " that finds nothing counts under recv)")
        res["profile_qd128"] = prof

    if shutil.which("valgrind") and shutil.which("callgrind_annotate"):
        lo_n, hi_n = (5000, 15000) if a.quick else (20000, 60000)
        print(f"== 1d. the target's user-space instructions per I/O (callgrind on the target, QD 128 4 KiB randread,"
              f" {hi_n} - {lo_n} I/Os; deterministic but for the idle polls before the host connects, about 1%)")
        per = (callgrind_target(hi_n) - callgrind_target(lo_n)) / (hi_n - lo_n)
        print(f"   {per:.1f} instructions per I/O")
        res["target_instr_per_io"] = per
    else:
        print("== 1d. skipped: valgrind missing")


    print(f"== 2. QD 1 4 KiB randread p50 latency, {runs} runs x {secs} s"
          + (", each followed by the bare-kernel floor (2b)" if have_bound else ""))
    p50, floor, over = [], [], []
    for _ in range(runs):
        tot, _, _ = run([], ["-c", "1", "-q", "1", "-o", "4096", "-w", "randread", "-L"], secs)
        p50.append(tot["p50_lat_us"])
        line = f"   p50 {tot['p50_lat_us']:.1f} us, p99 {tot.get('p99_lat_us', float('nan')):.1f} us, {fmt(tot['iops'])} IOPS"
        if have_bound:
            b = loopback_rtt(secs)
            floor.append(b["p50_us"])
            over.append(tot["p50_lat_us"] / b["p50_us"])
            line += f"; bare round trip p50 {b['p50_us']:.1f} us, target/bare {over[-1]:.2f}"
        print(line)
    m, lo, hi = med_range(p50)
    print(f"   p50 median {m:.1f} us (range {lo:.1f} .. {hi:.1f})   (target <= SPDK's 12.2 us)")
    res["qd1_p50_us"] = {"median": m, "min": lo, "max": hi, "runs": p50}
    if have_bound:
        fm, flo, fhi = med_range(floor)
        om, olo, ohi = med_range(over)
        print(f"== 2b. the bare-kernel floor of a QD 1 read (loopback_bound --rtt: a 72 B request from core 1, a 24 B +"
              f" 4 KiB answer from core 0, both polling, nothing else), interleaved with the runs above")
        print(f"   bare p50 median {fm:.1f} us (range {flo:.1f} .. {fhi:.1f}); pollux/bare median {om:.2f}"
              f" (range {olo:.2f} .. {ohi:.2f}); 12.2 us is {12.2 / fm:.2f} x the bare median")
        res["qd1_floor_us"] = {"median": fm, "min": flo, "max": fhi, "runs": floor,
                               "pollux_over_bare": {"median": om, "min": olo, "max": ohi}}

    print(f"== 3. techniques, on/off interleaved, {runs} pairs x {secs} s")
    techniques = [
        ("host disables SQ flow control (QD 128 IOPS; off: sqflow:1)", [], [],
         ["-c", "1", "-q", "128", "-o", "4096", "-w", "randread"], "iops", "0x1", "", "sqflow:1"),
        ("sendmsg batch: up to 512 iovecs (a full queue's responses) vs 64 (QD 128 IOPS)", [], ["--send-iov", "64"],
         ["-c", "1", "-q", "128", "-o", "4096", "-w", "randread"], "iops", "0x1", "", ""),
        ("direct receive", [], ["--no-direct-receive"],
         ["-c", "1", "-q", "32", "-o", "131072", "-w", "randwrite"], "iops", "0x1", "", ""),
        ("epoll idle sleep (QD 1 p50, lower is better)", [], ["--no-epoll-idle"],
         ["-c", "1", "-q", "1", "-o", "4096", "-w", "randread", "-L"], "p50_lat_us", "0x1", "", ""),
        ("SO_INCOMING_CPU (2 target threads)", ["--incoming-cpu"], [],
         ["-c", "0,1", "-P", "2", "-q", "64", "-o", "4096", "-w", "randread"], "iops", "0x3", "", ""),
    ]
    res["techniques"] = {}
    for name, on, off, pargs, key, mask, on_host, off_host in techniques:
        ratios = []
        for i in range(runs):
            order = [(True, on, on_host), (False, off, off_host)]
            if i % 2:
                order.reverse()
            got = {}
            for is_on, targs, host in order:
                tot, _, _ = run(targs, pargs, secs, mask, host)
                got[is_on] = tot[key]
            ratios.append(got[True] / got[False] if got[False] else float("nan"))
            print(f"   {name}: on {got[True]:.1f}  off {got[False]:.1f}  on/off {ratios[-1]:.3f}")
        m, lo, hi = med_range(ratios)
        print(f"   {name}: on/off median {m:.3f} (range {lo:.3f} .. {hi:.3f}) [{key}]")
        res["techniques"][name] = {"median": m, "min": lo, "max": hi, "metric": key}

    rt1 = round_trip()
    print(f"cross-core round trip after: {rt1} ns; load average {os.getloadavg()[0]:.2f}")
    res["round_trip_ns"] = [rt0, rt1]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
