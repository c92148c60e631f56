#!/usr/bin/env python3
"""Why one NVMe/TCP target serves more or fewer I/Os than another under the
same client: per target and client, the target process's system calls per
I/O (`perf stat -e raw_syscalls:sys_enter`) and of each kind that moves data
or waits (recvfrom, readv, sendmsg, writev, epoll_wait, io_uring_enter), the
TCP segments per I/O both ways (/proc/net/snmp OutSegs: loopback carries
the client's and the target's), the share of its CPU samples
in the kernel and in each of its top objects (`perf record -e cpu-clock`),
and the top symbols by self time; the IOPS of the same window.

Each target is a fresh process on core 0 (SPDK's nvmf_tgt and each pollux
target, all from bench/tcp_sbs.py's SPDK JSON config, null namespace), the
client on core 1: SPDK's perf or `pollux perf`, randread of `--bs` bytes
(4 KiB) at QD `--qd` (128). The
perf tools sample over SECS in the middle of a run of SECS + 3 s. Rounds
alternate the order of the targets. Figures are ratios and shares of this
machine: both perf tools slow what they watch a little, alike for every
target.

    bench/tcp_target_profile.py [--bin BIN] [--target NAME=BIN[,ARG...]]...
        [--clients spdk,pollux] [--rounds 3] [--secs 4] [--top 8] [--side target|client]
        [--bs 4096] [--qd 128] [--grep SYMBOL_RE]...

`--grep` adds the share of the samples whose symbol matches each regular
expression (say, the kernel's page pinning under zero-copy sends:
`--grep 'pin_user_pages|gup_|get_user_pages|iov_iter_extract'`).

With `--side client` the same is measured of the client process instead:
how each target's way of answering changes what the client spends.

Needs an SPDK build (../shared/spdk/build.sh; SPDK_DIR, default /tmp/spdk).
Wrap in `flock /tmp/bench.lock`."""
import argparse
import collections
import json
import os
import re
import statistics as st
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tcp_sbs  # noqa: E402  (its config, targets and clients)


# Block size and queue depth of the workload (`--bs`, `--qd`).
BS, QD = 4096, 128


def client_cmd(kind, spdk, client, secs):
    nqn = tcp_sbs.NQN_NULL
    if kind == "spdk":
        trid = (f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn} "
                f"hostnqn:{tcp_sbs.HOSTNQN}")
        return [f"{spdk}/build/bin/spdk_nvme_perf", "-c", "0x2", "-r", trid, "-q", str(QD), "-o", str(BS),
                "-w", "randread", "-t", str(secs)]
    trid = f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn}"
    return [client, "perf", "-c", "1", "-r", trid, "-q", str(QD), "-o", str(BS), "-w", "randread",
            "-t", str(secs), "--json"]


def iops_of(kind, out):
    if kind == "spdk":
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 5 and f[0] == "Total" and f[1] == ":":
                return float(f[2])
        return None
    try:
        return float(json.loads(out)["total"]["iops"])
    except (ValueError, KeyError):
        return None


def measure(target, kind, spdk, client, secs, tmp, tag, side, greps=()):
    """(IOPS, syscalls per I/O, {object: share}, kernel share, [(share, symbol)])."""
    target.start()
    data = os.path.join(tmp, f"{tag}.data")
    cl = subprocess.Popen(client_cmd(kind, spdk, client, secs + 3), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    time.sleep(1.5)
    pid = str(target.p.pid if side == "target" else cl.pid)
    segs0 = out_segs()
    stat = subprocess.Popen(["perf", "stat", "-x", ",", "-e",
                             ",".join(["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{k}" for k in KINDS]),
                             "-p", pid, "--", "sleep", str(secs)], stderr=subprocess.PIPE, text=True)
    rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-p", pid, "-o", data, "--",
                          "sleep", str(secs)], capture_output=True, text=True)
    _, err = stat.communicate()
    segs = out_segs() - segs0
    out, _ = cl.communicate(timeout=secs + 120)
    target.stop()
    iops = iops_of(kind, out)
    calls, kinds = None, {}
    for line in err.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[0].strip().isdigit():
            if "raw_syscalls:sys_enter" in f[2]:
                calls = int(f[0])
            elif f[2].startswith("syscalls:sys_enter_"):
                kinds[f[2][len("syscalls:sys_enter_"):]] = int(f[0])
    if rec.returncode != 0 or not iops:
        return None
    script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True,
                            text=True).stdout
    objs, syms, n = collections.Counter(), collections.Counter(), 0
    for line in script.splitlines():
        m = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", line)
        if not m:
            continue
        n += 1
        obj = os.path.basename(m.group(3))
        objs[obj] += 1
        syms[re.sub(r"\+0x[0-9a-f]+$", "", m.group(2))] += 1
    if n == 0:
        return None
    kernel = sum(v for k, v in objs.items() if "kernel" in k or k.startswith("[")) / n
    ios = iops * secs
    grepped = {g: sum(v for s, v in syms.items() if re.search(g, s)) / n for g in greps}
    return (iops, calls / ios if calls else None, {k: v / n for k, v in objs.items()}, kernel,
            [(v / n, s) for s, v in syms.most_common(40)], {k: v / ios for k, v in kinds.items()},
            segs / ios, grepped)


# The system calls counted apart (those that move data or wait).
KINDS = ["recvfrom", "readv", "sendmsg", "writev", "epoll_wait", "io_uring_enter"]


def out_segs():
    """TCP segments this host has sent (all sockets; /proc/net/snmp OutSegs)."""
    lines = [l.split() for l in open("/proc/net/snmp") if l.startswith("Tcp:")]
    return int(lines[1][lines[0].index("OutSegs")])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/pollux")
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--clients", default="spdk,pollux")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=int, default=4)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--side", choices=["target", "client"], default="target",
                    help="whose system calls and samples: the target's (default) or the client's")
    ap.add_argument("--bs", type=int, default=4096, help="block size of the randread workload")
    ap.add_argument("--qd", type=int, default=128, help="its queue depth")
    ap.add_argument("--grep", action="append", default=[],
                    help="also the share of samples whose symbol matches this regular expression")
    a = ap.parse_args()
    global BS, QD
    BS, QD = a.bs, a.qd
    spdk = os.environ.get("SPDK_DIR", "/tmp/spdk")
    if not os.access(f"{spdk}/build/bin/nvmf_tgt", os.X_OK):
        sys.exit(f"no SPDK build at {spdk} (../shared/spdk/build.sh)")
    tmp = tempfile.mkdtemp(prefix="tcp-prof-")
    conf = os.path.join(tmp, "conf.json")
    json.dump(tcp_sbs.config(), open(conf, "w"))
    subprocess.run(["sh", "-c", "[ $(cat /proc/sys/vm/nr_hugepages) -ge 1024 ] || echo 1024 > /proc/sys/vm/nr_hugepages;"
                    " mount | grep -q 'type hugetlbfs' || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }"])
    targets = [tcp_sbs.Target("spdk", [f"{spdk}/build/bin/nvmf_tgt", "-m", "0x1", "-r",
                                       os.path.join(tmp, "spdk.sock"), "--json", conf], tmp)]
    for t in a.target or [f"pollux={a.bin}"]:
        name, rest = t.split("=", 1)
        parts = rest.split(",")
        targets.append(tcp_sbs.Target(name, [parts[0], "target", "-c", conf, "-m", "0x1", "-r",
                                             os.path.join(tmp, f"{name}.sock")] + parts[1:], tmp))
    res = collections.defaultdict(list)
    for r in range(a.rounds):
        order = targets if r % 2 == 0 else [targets[0]] + targets[:0:-1]
        for t in order:
            for kind in a.clients.split(","):
                m = measure(t, kind, spdk, a.bin, a.secs, tmp, f"{r}-{t.name}-{kind}", a.side, a.grep)
                print(f"round {r} target {t.name} client {kind}: "
                      + (f"{m[0]:,.0f} IOPS, {m[1]:.2f} syscalls/IO, kernel {m[3]:.1%}" if m and m[1]
                         else "FAIL"), flush=True)
                if m:
                    res[(t.name, kind)].append(m)
    print()
    for kind in a.clients.split(","):
        for t in targets:
            ms = res.get((t.name, kind))
            if not ms:
                continue
            io = [m[0] for m in ms]
            sc = [m[1] for m in ms if m[1]]
            kn = [m[3] for m in ms]
            print(f"client {kind}, target {t.name}: IOPS {st.median(io):,.0f} ({min(io):,.0f}-{max(io):,.0f}); "
                  f"syscalls/IO {st.median(sc):.2f} ({min(sc):.2f}-{max(sc):.2f}); "
                  f"kernel share {st.median(kn):.1%} ({min(kn):.1%}-{max(kn):.1%})")
            objs = collections.Counter()
            syms = collections.Counter()
            for m in ms:
                for k, v in m[2].items():
                    objs[k] += v / len(ms)
                for v, s in m[4]:
                    syms[s] += v / len(ms)
            per = {k: st.median(m[5].get(k, 0) for m in ms) for k in KINDS}
            print("   per I/O: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items() if v)
                  + f"; TCP segments (both ways) {st.median(m[6] for m in ms):.3f}")
            print("   objects: " + ", ".join(f"{k} {v:.1%}" for k, v in objs.most_common(4)))
            for g in a.grep:
                sh = [m[7][g] for m in ms]
                print(f"   symbols matching {g!r}: {st.median(sh):.1%} ({min(sh):.1%}-{max(sh):.1%}) of the samples")
            for s, v in syms.most_common(a.top):
                print(f"   {v:6.1%}  {s}")
    print(f"\n(perf data in {tmp})")


if __name__ == "__main__":
    main()
