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
target, all from bench/tcp_sbs.py's SPDK JSON config, the null namespace or `--ns ram`), the
client on core 1: SPDK's perf or `pollux perf`, `--rw` (randread) of `--bs` bytes
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
after `--idle-spin` less). Each configuration's samples are also split by
stage (user space; the kernel's data copy, TCP send, TCP receive and
softirq, skb memory, locks, system call entry and epoll, perf's own
tracepoints, the rest: `STAGES`, by symbol), each with its CPU time per
I/O over the whole CPU time per I/O at the first `--conns` count (same
target, client and round): which stage grows with the connections.

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


# Block size, queue depth, pattern and namespace of the workload (`--bs`,
# `--qd`, `--rw`, `--ns`).
BS, QD, RW, NQN = 4096, 128, "randread", tcp_sbs.NQN_NULL


def client_cmd(kind, spdk, client, secs, conns=1):
    """The client's command line: `conns` connections, QD outstanding in all
    (SPDK's perf: `-q QD -P conns`; pollux perf: `-q QD/conns -P conns`, as
    bench/tcp_sbs.py's `multi` workload)."""
    nqn = NQN
    if kind == "spdk":
        trid = (f"trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn} "
                f"hostnqn:{tcp_sbs.HOSTNQN}")
        cmd = [f"{spdk}/build/bin/spdk_nvme_perf", "-c", "0x2", "-r", trid, "-q", str(QD), "-o", str(BS),
               "-w", RW, "-t", str(secs)]
    else:
        trid = f"trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{tcp_sbs.PORT} subnqn:{nqn}"
        cmd = [client, "perf", "-c", "1", "-r", trid, "-q", str(max(1, QD // conns)), "-o", str(BS),
               "-w", RW, "-t", str(secs), "--json"]
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
    objs, syms, stg, n = collections.Counter(), collections.Counter(), collections.Counter(), 0
    for line in script.splitlines():
        m = re.match(r"\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", line)
        if not m:
            continue
        n += 1
        obj = os.path.basename(m.group(3))
        objs[obj] += 1
        sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(2))
        syms[sym] += 1
        stg[stage(sym, obj)] += 1
    if n == 0:
        return None
    kernel = sum(v for k, v in objs.items() if "kernel" in k or k.startswith("[")) / n
    ios = iops * secs
    grepped = {g: sum(v for s, v in syms.items() if re.search(g, s)) / n for g in greps}
    return (iops, calls / ios if calls else None, {k: v / n for k, v in objs.items()}, kernel,
            [(v / n, s) for s, v in syms.most_common(40)], {k: v / ios for k, v in kinds.items()},
            segs / ios, grepped, {k: v / ios for k, v in empties.items()}, busy, {k: v / n for k, v in stg.items()})


# The system calls counted apart (those that move data or wait).
KINDS = ["recvfrom", "readv", "recvmsg", "sendmsg", "writev", "epoll_wait", "io_uring_enter"]
# The receive calls whose empty returns (-EAGAIN) are counted.
RECEIVES = ["recvfrom", "readv", "recvmsg"]


# Where the process's CPU time goes, by the symbol of each sample (self
# time, first match wins): user space (any object not the kernel), then
# the kernel's stages.
STAGES = [
    ("copy", r"copy_from_iter|copy_to_iter|copy_user|memcpy|memmove|rep_movs|copy_page|csum_partial_copy"),
    ("perf", r"^perf_|_perf_|^__perf"),
    ("lock", r"spin_lock|spin_unlock|queued_spin|lock_sock|release_sock|_raw_"),
    ("skb memory", r"skb_release|kmem_cache|kfree|__alloc_skb|kmalloc|page_frag|skb_attempt_defer|consume_skb|"
                   r"sk_mem|__build_skb|skb_clone|slab|__free_|alloc_pages|skb_free_head|napi_|sk_forced_mem|"
                   r"__sk_mem|mem_cgroup|memcg|refill_stock|obj_cgroup"),
    ("tcp receive", r"tcp_v4_rcv|tcp_rcv_|tcp_ack|tcp_data_queue|ip_rcv|ip_local_deliver|ip_protocol_deliver|"
                    r"netif_receive|net_rx_action|process_backlog|__inet_lookup|inet_lookup|tcp_clean_rtx|"
                    r"tcp_recvmsg|tcp_cleanup_rbuf|tcp_v4_do_rcv|softirq|tcp_rack|tcp_queue_rcv|"
                    r"sock_def_readable|ep_poll_callback|__wake_up|tcp_event_data_recv|tcp_check_space|"
                    r"tcp_urg|tcp_validate_incoming|tcp_sack|tcp_rearm_rto|tcp_update_pacing_rate|"
                    r"tcp_newly_delivered|tcp_rate_gen|tcp_add_backlog|tcp_filter|sk_filter|skb_copy_datagram|"
                    r"__skb_datagram_iter|tcp_schedule_loss_probe|tcp_ack_update_rtt|tcp_mstamp|tcp_grow_window|"
                    r"tcp_measure_rcv_mss|tcp_try_rmem_schedule|tcp_rcv_space_adjust|__tcp_ack_snd_check|"
                    r"tcp_send_ack|__tcp_send_ack|tcp_delack|inet_recvmsg|__netif_rx|netif_rx|enqueue_to_backlog"),
    ("tcp send", r"tcp_sendmsg|tcp_write_xmit|tcp_transmit_skb|tcp_push|tcp_skb_entail|tcp_stream_alloc_skb|"
                 r"ip_queue_xmit|ip_output|ip_finish_output|ip_local_out|__dev_queue_xmit|dev_hard_start_xmit|"
                 r"loopback_xmit|tcp_established_options|tcp_rate_skb_sent|tcp_event_new_data_sent|tcp_wfree|"
                 r"sk_stream|tcp_current_mss|tcp_send_mss|tcp_options_write|tcp_v4_send_check|tcp_small_queue|"
                 r"tcp_tso|tcp_mtu|ipv4_mtu|skb_entail|__tcp_push|tcp_chrono|tcp_cwnd|tcp_pacing|"
                 r"validate_xmit|netdev_core_pick|__ip_finish|ip_send_check|dst_release|neigh_|eth_|"
                 r"inet_sendmsg|tcp_rbtree_insert|tcp_skb_collapse|tcp_init_tso_segs|__skb_clone|"
                 r"tcp_nagle|tcp_snd_|sk_page_frag|skb_do_copy|skb_copy_to_page"),
    ("syscall", r"syscall|^entry_|__x64_sys|__sys_|sock_sendmsg|sock_recvmsg|fdget|__fget|fput|security_|"
                r"import_iovec|iovec_from_user|copy_msghdr|___sys|__import_iovec|rw_copy_check|do_iter|vfs_readv|"
                r"do_readv|sock_read_iter|sock_write_iter|__check_object_size|check_heap_object|__virt_addr_valid|"
                r"ep_poll|do_epoll|ep_send_events|ep_item_poll|tcp_poll|sock_poll|exit_to_user|"
                r"fpregs_|switch_fpu|rseq|arch_exit|irqentry|__rcu_read|rcu_read|ktime_get|clear_bhb|"
                r"restore_regs|__put_user|__get_user|_copy_from_user|_copy_to_user|move_addr_to|"
                r"sockfd_lookup|__fdget|x64_sys_call|do_sys|__se_sys|cgroup_bpf"),
]
STAGE_NAMES = ["user"] + [k for k, _ in STAGES] + ["other kernel"]
_STAGE_RE = [(k, re.compile(v)) for k, v in STAGES]


def stage(sym, obj):
    """The stage of one sample: its symbol `sym` in object `obj`."""
    if not ("kernel" in obj or obj.startswith("[")) or obj == "[vdso]":
        return "user"
    for k, r in _STAGE_RE:
        if r.search(sym):
            return k
    return "other kernel"


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
    ap.add_argument("--bs", type=int, default=4096, help="block size of the workload")
    ap.add_argument("--rw", default="randread", choices=["randread", "randwrite"], help="its pattern")
    ap.add_argument("--ns", default="null", choices=["null", "ram"],
                    help="its namespace: the null bdev, or the RAM one (SPDK's malloc, pollux's malloc)")
    ap.add_argument("--qd", type=int, default=128, help="its queue depth (in all, over --conns connections)")
    ap.add_argument("--conns", default="1",
                    help="client connections, a list (1,4,16): each target and client at each, rounds interleaved")
    ap.add_argument("--grep", action="append", default=[],
                    help="also the share of samples whose symbol matches this regular expression")
    a = ap.parse_args()
    global BS, QD, RW, NQN
    BS, QD, RW = a.bs, a.qd, a.rw
    NQN = tcp_sbs.NQN_RAM if a.ns == "ram" else tcp_sbs.NQN_NULL
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
                # Each stage's CPU time per I/O (its share x the process's
                # CPU time / I/Os) over the whole CPU time per I/O of the same
                # target and client at the first count, same round.
                rel = collections.defaultdict(list)
                for (r, n, k, cc), m in res.items():
                    b = res.get((r, n, k, conns[0]))
                    if n != t.name or k != kind or cc != c or not b or not m[9][0] or not b[9][0]:
                        continue
                    per, base = m[9][0] / m[0], b[9][0] / b[0]
                    rel["all"].append(per / base)
                    for g in STAGE_NAMES:
                        rel[g].append(m[10].get(g, 0) * per / base)
                print("   stages, share of samples [CPU per I/O / all CPU per I/O at "
                      f"{conns[0]} conn{'s' if conns[0] > 1 else ''}]: "
                      + ", ".join(f"{g} {st.median(m[10].get(g, 0) for m in ms):.1%} [{st.median(rel[g]):.3f}]"
                                  for g in STAGE_NAMES if rel[g])
                      + (f"; all [{st.median(rel['all']):.3f}]" if rel["all"] else ""))
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
