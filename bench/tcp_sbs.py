#!/usr/bin/env python3
"""NVMe/TCP side by side with SPDK v25.09, every figure of issue 22 in one
interleaved run.

    bench/tcp_sbs.py [--bin target/release/pollux] [--rounds 5] [--secs 3]
                     [--target NAME=BIN[,ARG...]]... [--only read,qd1,write,multi,bigread,fan]

Per round, in an order that alternates between rounds: the cross-core round
trip (`pollux pingpong`), the kernel's own floor (`loopback_bound --qd 128`:
a bare sender and receiver moving what a 4 KiB read workload moves; with
`qd1`, also `loopback_bound --rtt`: a bare 72-byte request / 24 + 4096-byte
answer exchange in turn, both polling, the QD 1 floor), then
each target as a fresh process on core 0 -- SPDK's nvmf_tgt and each pollux
target given (default: `pollux=BIN`) -- all from one SPDK JSON config: a
null bdev (4 KiB blocks) in cnode1, a RAM bdev (SPDK's malloc, pollux's
malloc; 4 KiB blocks) in cnode2. Each target is driven on core 1 by SPDK's
spdk_nvme_perf and by pollux perf:

    read    4 KiB randread, QD 128, null
    qd1     4 KiB randread, QD 1, null (average latency too)
    write   4 KiB randwrite QD 128 and 128 KiB randwrite QD 32, RAM
    multi   4 KiB randread over 4 and 16 connections (128 outstanding in all), null
    bigread 128 KiB randread, QD 32, null
    fan     4 KiB randread over 16 and 64 connections at QD 1 each, null (many
            quiet hosts: most receives of a poll find nothing)

Prints per workload and client: median IOPS of each target, and each pollux
target / SPDK's per round (median, range); pollux perf / SPDK perf against
SPDK's target; QD 1 latency pollux<->pollux / SPDK<->SPDK; the target /
the floor; several connections / one. With `qd1`: each QD 1 pair's average
latency (SPDK perf and pollux perf against each target) over that round's
`loopback_bound --rtt` mean, per round, then median and range; and the
pollux target's and pollux perf's extra latency over SPDK's (the cross
pairs: L(pollux target, X) - L(SPDK target, X) under each client X, and
L(X, pollux perf) - L(X, SPDK perf) against each target), over SPDK<->SPDK's. Loopback on a shared 2-vCPU VM: ratios
of this machine, not network or device speeds.

Needs a release build (`cargo build --release -p pollux-cli`, and the floor:
`cargo build --release -p pollux-nvmf --example loopback_bound`) and SPDK
built by ../shared/spdk/build.sh (default /tmp/spdk, env SPDK_DIR).
"""
import argparse
import collections
import json
import os
import socket
import statistics as st
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import round_trip  # noqa: E402  (bench/ab.py: the same round-trip probe)

PORT = 4470
NQN_NULL = "nqn.2016-06.io.spdk:cnode1"
NQN_RAM = "nqn.2016-06.io.spdk:cnode2"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:12a79949-9a45-41fa-85c6-a7381d014ef3"


def config():
    sub = []
    for nqn, bdev, serial in ((NQN_NULL, "Null0", "SPDK00000000000001"), (NQN_RAM, "Malloc0", "SPDK00000000000002")):
        sub += [
            {"method": "nvmf_create_subsystem", "params": {"nqn": nqn, "allow_any_host": True, "serial_number": serial}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": {"bdev_name": bdev}}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": nqn, "listen_address": {
                "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": str(PORT)}}},
        ]
    return {"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 262144, "block_size": 4096}},
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}},
        ]},
        {"subsystem": "nvmf", "config": [{"method": "nvmf_create_transport", "params": {"trtype": "TCP"}}] + sub},
    ]}


# name, subsystem, io size, workload, queue depth (in all), connections
WORKLOADS = {
    "read": [("read128", NQN_NULL, 4096, "randread", 128, 1)],
    "qd1": [("read1", NQN_NULL, 4096, "randread", 1, 1)],
    "write": [("write4k", NQN_RAM, 4096, "randwrite", 128, 1), ("write128k", NQN_RAM, 131072, "randwrite", 32, 1)],
    "multi": [("conn4", NQN_NULL, 4096, "randread", 128, 4), ("conn16", NQN_NULL, 4096, "randread", 128, 16)],
    "bigread": [("read128k", NQN_NULL, 131072, "randread", 32, 1)],
    "fan": [("fan16", NQN_NULL, 4096, "randread", 16, 16), ("fan64", NQN_NULL, 4096, "randread", 64, 64)],
}


def listening():
    s = socket.socket()
    try:
        s.settimeout(0.2)
        s.connect(("127.0.0.1", PORT))
        return True
    except OSError:
        return False
    finally:
        s.close()


class Target:
    def __init__(self, name, argv, tmp):
        self.name, self.argv, self.tmp, self.p = name, argv, tmp, None

    def start(self):
        log = open(os.path.join(self.tmp, f"{self.name}.log"), "w")
        self.p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if listening():
                time.sleep(0.3)
                return
            if self.p.poll() is not None:
                sys.exit(f"target {self.name} exited ({self.p.returncode}); see {log.name}")
            time.sleep(0.1)
        sys.exit(f"target {self.name} never listened on {PORT}; see {log.name}")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        for _ in range(50):
            if not listening():
                break
            time.sleep(0.1)
        time.sleep(0.3)


def sperf(spdk, nqn, size, wl, qd, conns, secs):
    trid = f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{PORT} subnqn:{nqn} hostnqn:{HOSTNQN}"
    cmd = [f"{spdk}/build/bin/spdk_nvme_perf", "-c", "0x2", "-r", trid, "-q", str(qd), "-o", str(size),
           "-w", wl, "-t", str(secs)]
    if conns > 1:
        cmd += ["-P", str(conns)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60).stdout
    except subprocess.TimeoutExpired:
        return None
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0] == "Total" and f[1] == ":":
            return float(f[2]), float(f[4])
    return None


def pperf(client, nqn, size, wl, qd, conns, secs):
    trid = f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{PORT} subnqn:{nqn}"
    cmd = [client, "perf", "-c", "1", "-r", trid, "-q", str(max(1, qd // conns)), "-o", str(size), "-w", wl,
           "-t", str(secs), "--json"]
    if conns > 1:
        cmd += ["-P", str(conns)]
    if qd == 1:
        cmd += ["-L"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60)
        t = json.loads(p.stdout)["total"]
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None
    return float(t["iops"]), t.get("avg_lat_us")


def floor(lb, secs):
    try:
        p = subprocess.run([lb, "--qd", "128", "--secs", str(secs), "--json"], capture_output=True, text=True,
                           timeout=secs + 60)
        d = json.loads(p.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return None
    for k in ("ios_per_s",):
        if k in d:
            return float(d[k])
    return None


def floor_rtt(lb, secs):
    """The kernel's QD 1 floor (`loopback_bound --rtt`): a bare 72-byte
    request and 24 + 4096-byte answer in turn, both sides polling; its
    {mean_us, p50_us, p99_us} (a build before the mean: p50 only)."""
    try:
        p = subprocess.run([lb, "--rtt", "--secs", str(secs), "--json"], capture_output=True, text=True,
                           timeout=secs + 60)
        return json.loads(p.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return None


def fmt(xs):
    return f"{st.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}, n={len(xs)})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/pollux")
    ap.add_argument("--client", help="the pollux perf used as pollux client (default --bin)")
    ap.add_argument("--target", action="append", default=[],
                    help="NAME=BIN[,ARG...]: a pollux target (repeatable; default pollux=--bin)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=int, default=3)
    ap.add_argument("--only", default="read,qd1,write,multi")
    ap.add_argument("--floor-bin", default="target/release/examples/loopback_bound")
    a = ap.parse_args()
    spdk = os.environ.get("SPDK_DIR", "/tmp/spdk")
    if not os.access(f"{spdk}/build/bin/nvmf_tgt", os.X_OK):
        sys.exit(f"no SPDK build at {spdk} (../shared/spdk/build.sh)")
    client = a.client or a.bin
    groups = [g for g in a.only.split(",") if g]
    wls = [w for g in groups for w in WORKLOADS[g]]
    tmp = tempfile.mkdtemp(prefix="tcp-sbs-")
    conf = os.path.join(tmp, "conf.json")
    json.dump(config(), open(conf, "w"))
    subprocess.run(["sh", "-c", "[ $(cat /proc/sys/vm/nr_hugepages) -ge 1024 ] || echo 1024 > /proc/sys/vm/nr_hugepages;"
                    " mount | grep -q 'type hugetlbfs' || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }"])
    targets = [Target("spdk", [f"{spdk}/build/bin/nvmf_tgt", "-m", "0x1", "-r", os.path.join(tmp, "spdk.sock"),
                               "--json", conf], tmp)]
    for t in a.target or [f"pollux={a.bin}"]:
        name, rest = t.split("=", 1)
        parts = rest.split(",")
        targets.append(Target(name, [parts[0], "target", "-c", conf, "-m", "0x1", "-r",
                                     os.path.join(tmp, f"{name}.sock")] + parts[1:], tmp))
    rows = []  # (round, target, client, workload, iops, avg_us)
    rtt, flo, rtt_of, flo1 = [], [], {}, {}
    print(f"rows in {tmp}/rows", flush=True)
    out = open(os.path.join(tmp, "rows"), "w")
    for r in range(a.rounds):
        x = round_trip(a.bin)
        if x:
            rtt.append(x)
            rtt_of[r] = x
            out.write(f"{r} rtt {x}\n")
        if "read" in groups and os.access(a.floor_bin, os.X_OK):
            f = floor(a.floor_bin, a.secs)
            if f:
                flo.append((r, f))
        if "qd1" in groups and os.access(a.floor_bin, os.X_OK):
            f = floor_rtt(a.floor_bin, a.secs)
            if f:
                flo1[r] = f
                line = f"{r} floor-rtt {f.get('mean_us', '')} {f.get('p50_us')} {f.get('p99_us')}"
                print(line, flush=True)
                out.write(line + "\n")
        order = targets if r % 2 == 0 else [targets[0]] + targets[:0:-1]
        for t in order:
            t.start()
            for name, nqn, size, wl, qd, conns in wls:
                for cname, fn, arg in (("spdk", sperf, spdk), ("pollux", pperf, client)):
                    v = fn(arg, nqn, size, wl, qd, conns, a.secs)
                    line = f"{r} {t.name} {cname} {name} {v[0] if v else 'FAIL'} {v[1] if v else ''}"
                    print(line, flush=True)
                    out.write(line + "\n")
                    out.flush()
                    if v:
                        rows.append((r, t.name, cname, name, v[0], v[1]))
            t.stop()
    d = {(r, t, c, w): (i, l) for r, t, c, w, i, l in rows}
    names = [t.name for t in targets[1:]]
    print(f"\ncross-core round trip: median {st.median(rtt):.0f} ns (range {min(rtt):.0f}-{max(rtt):.0f})" if rtt else "")
    for name, *_ in wls:
        for c in ("spdk", "pollux"):
            med = {t.name: st.median([v[0] for k, v in d.items() if k[1] == t.name and k[2] == c and k[3] == name] or [0])
                   for t in targets}
            line = f"{name:10} client={c:6} IOPS " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items())
            for n in names:
                x = [d[(r, n, c, name)][0] / d[(r, "spdk", c, name)][0] for r in range(a.rounds)
                     if (r, n, c, name) in d and (r, "spdk", c, name) in d]
                if x:
                    line += f"; {n}/spdk {fmt(x)}"
            print(line)
    # The vCPUs' placement moves between rounds (the round trip with it):
    # each round's round trip beside its IOPS shows what follows it.
    print("\nper round: cross-core round trip, then IOPS per target and client")
    for r in range(a.rounds):
        cells = [f"{t.name}/{c[0]} {d[(r, t.name, c, name)][0] / 1e3:,.0f}K"
                 for name, *_ in wls for t in targets for c in ("spdk", "pollux") if (r, t.name, c, name) in d]
        print(f"  {r}: {rtt_of.get(r, 0):.0f} ns  " + " ".join(cells))
    print()
    for name, *_ in wls:
        x = [d[(r, "spdk", "pollux", name)][0] / d[(r, "spdk", "spdk", name)][0] for r in range(a.rounds)
             if (r, "spdk", "pollux", name) in d and (r, "spdk", "spdk", name) in d]
        if x:
            print(f"against SPDK's target, {name}: pollux perf / SPDK perf {fmt(x)}")
    if "qd1" in groups:
        for n in names:
            x = [d[(r, n, "pollux", "read1")][1] / d[(r, "spdk", "spdk", "read1")][1] for r in range(a.rounds)
                 if (r, n, "pollux", "read1") in d and (r, "spdk", "spdk", "read1") in d
                 and d[(r, n, "pollux", "read1")][1]]
            if x:
                print(f"QD 1 average latency, pollux perf<->{n} / SPDK perf<->SPDK: {fmt(x)}")
    if flo1:
        qd1_over_floor(d, flo1, targets, a.rounds, rtt_of)
    if flo:
        print(f"floor (loopback_bound --qd 128): median {st.median([f for _, f in flo]):,.0f}")
        for n in names:
            x = [d[(r, n, "pollux", "read128")][0] / f for r, f in flo if (r, n, "pollux", "read128") in d]
            if x:
                print(f"{n} target under pollux perf, QD 128 / floor: {fmt(x)}")
    if "multi" in groups and "read" in groups:
        for t in targets:
            for c in ("spdk", "pollux"):
                for m in ("conn4", "conn16"):
                    x = [d[(r, t.name, c, m)][0] / d[(r, t.name, c, "read128")][0] for r in range(a.rounds)
                         if (r, t.name, c, m) in d and (r, t.name, c, "read128") in d]
                    if x:
                        print(f"{t.name} target, client {c}: {m} / one connection {fmt(x)}")


def qd1_over_floor(d, flo1, targets, rounds, rtt_of):
    """Each QD 1 pair's average latency over the kernel's bare QD 1 round
    trip of the same round, and how pollux<->pollux's excess over SPDK<->SPDK
    splits between the target and the client (the cross pairs)."""
    key = "mean_us" if all("mean_us" in f for f in flo1.values()) else "p50_us"
    print(f"\nQD 1 average latency / the kernel's QD 1 round trip (loopback_bound --rtt, its {key[:-3]}), per round:")
    pairs = [(t.name, c) for t in targets for c in ("spdk", "pollux")]
    ratio = collections.defaultdict(list)
    for r in range(rounds):
        f = flo1.get(r)
        if not f:
            continue
        cells = []
        for t, c in pairs:
            v = d.get((r, t, c, "read1"))
            if v and v[1]:
                ratio[(t, c)].append(v[1] / f[key])
                cells.append(f"{c} perf<->{t} {v[1] / f[key]:.3f}")
        print(f"  {r}: round trip {rtt_of.get(r, 0):.0f} ns, floor {f[key]:.1f} us (p99 {f['p99_us']:.1f}); "
              + ", ".join(cells))
    for (t, c), xs in ratio.items():
        print(f"  {c} perf<->{t} target / floor: {fmt(xs)}")
    # The floor's mean takes in its rare long round trips (a preempted
    # side), its p50 not: both, against SPDK<->SPDK and pollux<->pollux.
    for k in dict.fromkeys((key, "p50_us")):
        for t, c in (("spdk", "spdk"), (targets[-1].name, "pollux")):
            fl = [f[k] / d[(r, t, c, "read1")][1] for r, f in flo1.items()
                  if (r, t, c, "read1") in d and d[(r, t, c, "read1")][1]]
            if fl:
                print(f"  floor ({k[:-3]}) / {c} perf<->{t}: {fmt(fl)}")
    # With L(target, client) = floor + T(target) + C(client): the pollux
    # target's extra time is L(pollux, X) - L(spdk, X) under either client X,
    # the pollux client's L(X, pollux) - L(X, spdk) against either target;
    # each over SPDK<->SPDK's latency.
    for n in [t.name for t in targets[1:]]:
        for what, a_, b_ in (("target " + n + " - SPDK's, under SPDK perf", (n, "spdk"), ("spdk", "spdk")),
                             ("target " + n + " - SPDK's, under pollux perf", (n, "pollux"), ("spdk", "pollux")),
                             ("pollux perf - SPDK perf, against SPDK's target", ("spdk", "pollux"), ("spdk", "spdk")),
                             ("pollux perf - SPDK perf, against " + n, (n, "pollux"), (n, "spdk"))):
            x = [(d[(r, *a_, "read1")][1] - d[(r, *b_, "read1")][1]) / d[(r, "spdk", "spdk", "read1")][1]
                 for r in range(rounds)
                 if all((r, *k, "read1") in d and d[(r, *k, "read1")][1] for k in (a_, b_, ("spdk", "spdk")))]
            if x:
                print(f"  {what}, over SPDK<->SPDK's latency: {fmt(x)}")


if __name__ == "__main__":
    main()
