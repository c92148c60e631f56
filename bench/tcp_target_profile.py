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
        [--bs 4096] [--qd 128] [--conns 1,4,16] [--grep SYMBOL_RE]...

`--conns` takes a list of client connection counts (default 1): the QD
outstanding in all is spread over them (SPDK's perf `-q QD -P N`, pollux
perf `-q QD/N -P N`, as bench/tcp_sbs.py's `multi`); each target, count
and client is measured in every round (counts in alternating order), and
it prints N connections / the first count's IOPS and each pollux target /
SPDK's per round (median, range). Beside the system calls, it counts the
receives that found nothing (recvfrom, readv, recvmsg returning -EAGAIN:
`syscalls:sys_exit_*` filtered on the return) per I/O, and the CPU time
of the target and of the client process over the window (/proc/PID/stat;
a poll-mode process is busy all the time, a pollux target that sleeps
after `--idle-spin` less).

`--grep` adds the share of the samples whose symbol matches each regular
expression (say, the kernel's page pinning under zero-copy sends:
`--grep 'pin_user_pages|gup_|get_user_pages|iov_iter_extract'`).

With `--side client` the same is measured of the client process instead:
how each target's way of answering changes what the client spends.

Needs an SPDK build (../shared/spdk/build.sh; SPDK_DIR, default /tmp/spdk).
Wrap in `flock /tmp/bench.lock`."""
import argparse
import collections
import errno
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


def client_cmd(kind, spdk, client, secs, conns=1):
    """The client's command line: `conns` connections, QD outstanding in all
    (SPDK's perf: `-q QD -P conns`; pollux perf: `-q QD/conns -P conns`, as
    bench/tcp_sbs.py's `multi` workload)."""
    nqn = tcp_sbs.NQN_NULL
    if kind == "spdk":
        trid = (f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn} "
                f"hostnqn:{tcp_sbs.HOSTNQN}")
        cmd = [f"{spdk}/build/bin/spdk_nvme_perf", "-c", "0x2", "-r", trid, "-q", str(QD), "-o", str(BS),
               "-w", "randread", "-t", str(secs)]
    else:
        trid = f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn}"
        cmd = [client, "perf", "-c", "1", "-r", trid, "-q", str(max(1, QD // conns)), "-o", str(BS),
               "-w", "randread", "-t", str(secs), "--json"]
    if conns > 1:
        cmd += ["-P", str(conns)]
    return cmd


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


def measure(target, kind, spdk, client, secs, tmp, tag, side, greps=(), conns=1):
    """(IOPS, syscalls per I/O, {object: share}, kernel share, [(share, symbol)],
    {kind: per I/O}, TCP segments per I/O, {grep: share}, {receive kind: empty per I/O},
    (target CPU, client CPU) as shares of the window)."""
    target.start()
    data = os.path.join(tmp, f"{tag}.data")
    cl = subprocess.Popen(client_cmd(kind, spdk, client, secs + 3, conns), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    time.sleep(1.5)
    pid = str(target.p.pid if side == "target" else cl.pid)
    segs0 = out_segs()
    cpu0 = (cpu_ticks(target.p.pid), cpu_ticks(cl.pid), time.monotonic())
    # Receives that found nothing: the receive calls' exits with -EAGAIN.
    empty = []
    for k in RECEIVES:
        empty += ["-e", f"syscalls:sys_exit_{k}", "--filter", f"ret == {-errno.EAGAIN}"]
    stat = subprocess.Popen(["perf", "stat", "-x", ",", "-e",
                             ",".join(["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{k}" for k in KINDS])]
                            + empty + ["-p", pid, "--", "sleep", str(secs)], stderr=subprocess.PIPE, text=True)
    rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-p", pid, "-o", data, "--",
                          "sleep", str(secs)], capture_output=True, text=True)
    _, err = stat.communicate()
    segs = out_segs() - segs0
    cpu1 = (cpu_ticks(target.p.pid), cpu_ticks(cl.pid), time.monotonic())
    hz, wall = os.sysconf("SC_CLK_TCK"), cpu1[2] - cpu0[2]
    busy = tuple((b - a) / hz / wall if a is not None and b is not None else None
                 for a, b in zip(cpu0[:2], cpu1[:2]))
    out, _ = cl.communicate(timeout=secs + 120)
    target.stop()
    iops = iops_of(kind, out)
    calls, kinds, empties = None, {}, {}
    for line in err.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[0].strip().isdigit():
            if "raw_syscalls:sys_enter" in f[2]:
                calls = int(f[0])
            elif f[2].startswith("syscalls:sys_enter_"):
                kinds[f[2][len("syscalls:sys_enter_"):]] = int(f[0])
            elif f[2].startswith("syscalls:sys_exit_"):
                empties[f[2][len("syscalls:sys_exit_"):]] = int(f[0])
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
            segs / ios, grepped, {k: v / ios for k, v in empties.items()}, busy)


# The system calls counted apart (those that move data or wait).
KINDS = ["recvfrom", "readv", "recvmsg", "sendmsg", "writev", "epoll_wait", "io_uring_enter"]
# The receive calls whose empty returns (-EAGAIN) are counted.
RECEIVES = ["recvfrom", "readv", "recvmsg"]


def cpu_ticks(pid):
    """User + system clock ticks of a process (all its threads), None once gone."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(f[11]) + int(f[12])


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
    ap.add_argument("--qd", type=int, default=128, help="its queue depth (in all, over --conns connections)")
    ap.add_argument("--conns", default="1",
                    help="client connections, a list (1,4,16): each target and client at each, rounds interleaved")
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
    conns = [int(c) for c in a.conns.split(",") if c]
    if not conns or min(conns) < 1 or max(conns) > QD:
        sys.exit(f"--conns {a.conns!r}: each must be 1..{QD} (the queue depth in all)")
    clients = [k for k in a.clients.split(",") if k]
    res = {}  # (round, target, client, conns) -> measure()
    for r in range(a.rounds):
        order = targets if r % 2 == 0 else [targets[0]] + targets[:0:-1]
        for t in order:
            for c in (conns if r % 2 == 0 else conns[::-1]):
                for kind in clients:
                    m = measure(t, kind, spdk, a.bin, a.secs, tmp, f"{r}-{t.name}-{kind}-{c}", a.side, a.grep, c)
                    print(f"round {r} target {t.name} client {kind} conns {c}: "
                          + (f"{m[0]:,.0f} IOPS, {m[1]:.2f} syscalls/IO, empty receives/IO "
                             f"{sum(m[8].values()):.2f}, kernel {m[3]:.1%}" if m and m[1] else "FAIL"), flush=True)
                    if m:
                        res[(r, t.name, kind, c)] = m
    print()

    def med(xs, f="{:.3f}"):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "-"
        return f"{f.format(st.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"

    for kind in clients:
        for c in conns:
            for t in targets:
                ms = [m for (r, n, k, cc), m in sorted(res.items()) if n == t.name and k == kind and cc == c]
                if not ms:
                    continue
                print(f"client {kind}, {c} conn{'s' if c > 1 else ''}, target {t.name}: "
                      f"IOPS {med([m[0] for m in ms], '{:,.0f}')}; syscalls/IO {med([m[1] for m in ms], '{:.2f}')}; "
                      f"kernel share {med([m[3] for m in ms], '{:.1%}')}; CPU busy: target "
                      f"{med([m[9][0] for m in ms], '{:.0%}')}, client {med([m[9][1] for m in ms], '{:.0%}')}")
                objs = collections.Counter()
                syms = collections.Counter()
                for m in ms:
                    for k, v in m[2].items():
                        objs[k] += v / len(ms)
                    for v, sym in m[4]:
                        syms[sym] += v / len(ms)
                per = {k: st.median(m[5].get(k, 0) for m in ms) for k in KINDS}
                emp = {k: st.median(m[8].get(k, 0) for m in ms) for k in RECEIVES}
                print("   per I/O: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items() if v)
                      + f"; TCP segments (both ways) {st.median(m[6] for m in ms):.3f}")
                print("   empty receives (-EAGAIN) per I/O: " + (", ".join(f"{k} {v:.3f}" for k, v in emp.items() if v)
                                                               or "none")
                      + f"; all {med([sum(m[8].values()) for m in ms])}")
                print("   objects: " + ", ".join(f"{k} {v:.1%}" for k, v in objs.most_common(4)))
                for g in a.grep:
                    sh = [m[7][g] for m in ms]
                    print(f"   symbols matching {g!r}: {st.median(sh):.1%} ({min(sh):.1%}-{max(sh):.1%}) of the samples")
                for sym, v in syms.most_common(a.top):
                    print(f"   {v:6.1%}  {sym}")
    # Per round ratios: several connections / one (same target and client),
    # and each pollux target / SPDK's (same client and connections).
    print()
    for kind in clients:
        for t in targets:
            for c in conns:
                if c == conns[0]:
                    continue
                x = [res[(r, t.name, kind, c)][0] / res[(r, t.name, kind, conns[0])][0] for r in range(a.rounds)
                     if (r, t.name, kind, c) in res and (r, t.name, kind, conns[0]) in res]
                if x:
                    print(f"client {kind}, target {t.name}: {c} conns / {conns[0]} IOPS {med(x)}")
        for t in targets[1:]:
            for c in conns:
                x = [res[(r, t.name, kind, c)][0] / res[(r, "spdk", kind, c)][0] for r in range(a.rounds)
                     if (r, t.name, kind, c) in res and (r, "spdk", kind, c) in res]
                if x:
                    print(f"client {kind}, {c} conns: {t.name}/spdk IOPS {med(x)}")
    print(f"\n(perf data in {tmp})")


if __name__ == "__main__":
    main()
