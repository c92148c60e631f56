#!/usr/bin/env python3
"""pollux host multipath: the failover gap and multipath IOPS vs one path,
interleaved in one run.

    bench/multipath.py [--bin target/release/pollux] [--rounds 5] [--secs 4]
                       [--qd 32] [--target-core 1] [--perf-core 0]

Two `pollux target` processes (core --target-core) export one file through
io_uring under one subsystem NQN; `pollux perf` runs on --perf-core. Per
round, in an order that alternates between rounds:

    one     4 KiB randread, -q QD, through the first target only
    multi   the same over both targets (--multipath, active_active
            round_robin)
    gap     4 KiB randrw --verify over both targets; the first target is
            killed (SIGKILL) a third of the way in and started again on its
            port at two thirds; the run's longest interval between
            completions (perf's max_completion_gap_us) is the failover gap
    base    the same run with no target killed: its longest interval
            between completions is what the machine's scheduling alone
            gives (on a shared VM, stalls of its own; a failover gap is
            only as meaningful as this baseline is low)

The file is in /dev/shm (tmpfs) when it exists, so the targets' backend
is memory. Prints per figure the median and range over the rounds, the multipath /
one-path IOPS ratio per round, and each failover run's errors and whether
the path came back. Loopback on a shared 2-vCPU VM with both targets on one
core: the ratio shows the host's cost of multipath, not two paths'
bandwidth. Needs a release build (`cargo build --release -p pollux-cli`).
"""
import argparse
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
import time

NQN = "nqn.2024-01.io.pollux:mp-bench"


def start_target(b, img, core, port, sock):
    p = subprocess.Popen(
        [b, "target", "--listen", f"127.0.0.1:{port}", "--uring", img, "--nqn", NQN,
         "-m", hex(1 << core), "-r", sock],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline().strip()
    prefix = "pollux target: listening on "
    if not line.startswith(prefix):
        p.kill()
        sys.exit(f"target did not start: {line!r}")
    return p, int(line[len(prefix):].rsplit(":", 1)[1])


def stop(p):
    p.kill()
    p.wait()


def trid(port):
    return f"trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN} reconnect_delay:1"


def perf(b, args, core):
    r = subprocess.run([b, "perf", "--json", "-c", str(core)] + args,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"perf failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def show(name, xs, unit):
    print(f"{name:<28} median {st.median(xs):>12.1f} {unit}  range {min(xs):.1f} .. {max(xs):.1f}  "
          f"({', '.join(f'{x:.1f}' for x in xs)})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/pollux")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=int, default=4)
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--target-core", type=int, default=1)
    ap.add_argument("--perf-core", type=int, default=0)
    a = ap.parse_args()
    b = os.path.abspath(a.bin)
    tmp = tempfile.mkdtemp(prefix="pollux-mp-bench-",
                           dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    img = os.path.join(tmp, "ns.img")
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    socks = [os.path.join(tmp, f"t{i}.sock") for i in range(2)]
    ta, pa = start_target(b, img, a.target_core, 0, socks[0])
    tb, pb = start_target(b, img, a.target_core, 0, socks[1])
    base = ["-q", str(a.qd), "-o", "4096", "-t", str(a.secs)]
    one, multi, ratio, gaps, base_gaps = [], [], [], [], []
    try:
        # Fill the file once, so reads read data.
        perf(b, ["-r", trid(pa), "-q", "32", "-o", "131072", "-w", "write", "-t", "2"],
             a.perf_core)
        for rnd in range(a.rounds):
            order = ["one", "multi", "gap", "base"]
            if rnd % 2:
                order.reverse()
            got = {}
            for w in order:
                if w == "one":
                    got[w] = perf(b, ["-r", trid(pa), "-w", "randread"] + base,
                                  a.perf_core)["total"]["iops"]
                elif w == "base":
                    secs = max(a.secs, 3) * 2
                    j = perf(b, ["--multipath", "-r", trid(pa), "-r", trid(pb), "-w", "randrw",
                                 "--verify", "-q", str(a.qd), "-o", "4096", "-t", str(secs)],
                             a.perf_core)
                    got[w] = j["total"]["max_completion_gap_us"] / 1e3
                    if j["total"]["errors"]:
                        print(f"round {rnd}: baseline run had {j['total']['errors']} errors")
                elif w == "multi":
                    got[w] = perf(b, ["--multipath", "-r", trid(pa), "-r", trid(pb),
                                      "-w", "randread"] + base, a.perf_core)["total"]["iops"]
                else:
                    secs = max(a.secs, 3) * 2
                    p = subprocess.Popen(
                        [b, "perf", "--json", "-c", str(a.perf_core), "--multipath",
                         "-r", trid(pa), "-r", trid(pb), "-w", "randrw", "--verify",
                         "-q", str(a.qd), "-o", "4096", "-t", str(secs)],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    time.sleep(secs / 3)
                    stop(ta)
                    time.sleep(secs / 3)
                    ta, _ = start_target(b, img, a.target_core, pa, socks[0])
                    out, err = p.communicate(timeout=120)
                    j = json.loads(out.strip().splitlines()[-1])
                    paths = j["devices"][0]["paths"]
                    gap_ms = j["total"]["max_completion_gap_us"] / 1e3
                    print(f"round {rnd}: failover gap {gap_ms:.1f} ms, errors {j['total']['errors']}, "
                          f"first path down {paths[0]['downs']}x back {paths[0]['ups']}x, "
                          f"{paths[0]['failed_over']} I/Os failed over", flush=True)
                    got[w] = gap_ms
            one.append(got["one"])
            multi.append(got["multi"])
            ratio.append(got["multi"] / got["one"])
            gaps.append(got["gap"])
            base_gaps.append(got["base"])
            print(f"round {rnd}: one path {got['one']:.0f} IOPS, two paths {got['multi']:.0f} IOPS, "
                  f"ratio {ratio[-1]:.3f}; longest gap {got['gap']:.1f} ms with a kill, "
                  f"{got['base']:.1f} ms without", flush=True)
        print()
        show("one path IOPS", one, "IOPS")
        show("multipath IOPS", multi, "IOPS")
        show("multipath / one path", ratio, "x")
        show("failover gap", gaps, "ms")
        show("longest gap, no failover", base_gaps, "ms")
    finally:
        stop(ta)
        stop(tb)
        for f in [img] + socks:
            try:
                os.unlink(f)
            except OSError:
                pass
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
