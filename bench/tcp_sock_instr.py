#!/usr/bin/env python3
"""The target's user-space instructions per I/O under callgrind (deterministic, so
two builds or two switch settings compare without the machine's noise): per
variant, the target (core 0, null namespace of 4 KiB blocks) under valgrind
--tool=callgrind serves `pollux perf` (core 1) LO then HI reads in two runs;
(HI run - LO run) / (HI - LO) is the per-I/O cost, start-up and idle polls cancel.
  bench/tcp_sock_instr.py [--qd 128] [--size 4096] [--lo 5000] [--hi 15000]
        NAME=BINARY[,TARGET_ARG...] ...
e.g. before=/tmp/pollux-before,--sock-impl,uring after=target/release/pollux,--sock-impl,uring
Wrap in `flock /tmp/bench.lock` (it runs long, not timed, but loads both cores)."""
import argparse, json, os, socket, subprocess, sys, tempfile, time

NQN = "nqn.2016-06.io.spdk:cnode1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def instructions(binary, args, qd, size, ios):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        port = free_port()
        t = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "target",
                              "--listen", f"127.0.0.1:{port}", "--null", "64GiB", "--block-size", "4096",
                              "--nqn", NQN, "-m", "0x1", "-r", os.path.join(d, "rpc.sock")] + args,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            t.kill()
            sys.exit(f"{binary} {args}: the target did not listen")
        trid = f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"
        p = subprocess.run(["taskset", "-c", "1", binary, "perf", "-c", "1", "-r", trid, "-q", str(qd), "-o",
                            str(size), "-w", "randread", "--io-count", str(ios), "-t", "0", "--json"],
                           capture_output=True, text=True, timeout=600)
        t.send_signal(2)
        t.wait(timeout=120)
        if p.returncode != 0 or json.loads(p.stdout)["total"].get("errors", 0):
            sys.exit(f"perf failed: {p.stderr[-1000:]}")
        a = subprocess.run(["callgrind_annotate", "--threshold=100", out], capture_output=True, text=True).stdout
    for line in a.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    sys.exit("could not parse callgrind_annotate's output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qd", type=int, default=128)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--lo", type=int, default=5000)
    ap.add_argument("--hi", type=int, default=15000)
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    for v in a.variants:
        name, spec = v.split("=", 1)
        binary, *args = spec.split(",")
        lo = instructions(binary, args, a.qd, a.size, a.lo)
        hi = instructions(binary, args, a.qd, a.size, a.hi)
        print(f"{name}: {(hi - lo) / (a.hi - a.lo):.1f} target user-space instructions per I/O"
              f" (QD {a.qd}, {a.size} bytes, {a.hi} - {a.lo} I/Os)", flush=True)


main()
