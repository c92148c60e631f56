#!/usr/bin/env python3
"""Host instructions per I/O of `pollux perf --inline` over the emulated
controller (null backend), split by who executes them: the driver
(pollux-nvme, pollux-pcie, pollux-spec, pollux-host), the perf loop
(pollux-cli), unknown (code the compiler merged from several places:
line 0 in the line table, no inline chain below the merge point), the
rest (std code not inlined, libc, other crates).

Deterministic (callgrind). One run pair: `--io-count LO` and `--io-count
HI`, (HI - LO) / (HI - LO I/Os), so start-up and teardown cancel out.
Each length runs twice: the whole program, and only the emulated device
(`--toggle-collect` on `SoftDevice::step`, the inline device's entry);
host = whole - device, per instruction address. The device (softnvme and
what it inlines: controller, bdev, spec) is never counted as host.

Every host instruction is attributed through its inline chain
(addr2line -i): to the innermost frame that lies in a crate of this
workspace, so std code inlined into the driver (`Vec::pop` in submit.rs)
counts as the driver's, and the perf handler inlined into the driver's
completion loop counts as the perf loop's. What is in no workspace frame
(not inlined std, libc) is "other".

Usage: bench/instr_split.py [BIN] [--qd 128] [--lo 20000] [--hi 60000]
           [--files] [--functions N] [--listing] [--bdevperf]
Prints host total, driver share, perf-loop share, other; with --files
the split by source file, with --functions the top N functions (by the
innermost workspace frame's function)."""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The inline device's entry; if the build inlined it into the perf loop
# (no call to toggle on), the controller's step below it.
DEVICE_ENTRIES = ("pollux_softnvme::device::SoftDevice::step",
                  "pollux_softnvme::ctrl::Controller::step")
DRIVER = {"nvme", "pcie", "spec", "host"}


def perf_cmd(binary, qd, extra=()):
    return [binary, "perf", "--json", "--inline", "-t", "0", "-q", str(qd), "-o", "4096",
            "-w", "randread", *extra]


def bdevperf_cmd(binary, qd):
    """The same workload through `pollux bdevperf` (an nvme bdev over the
    emulated controller)."""
    return [binary, "bdevperf", "--json", "--inline", "-t", "0", "-q", str(qd), "-o", "4096",
            "-w", "randread", "--nvme", "trtype:soft backend:null"]


def callgrind(cmd, ios, device_only, d):
    """Per-address Ir of one run: {(object, addr): Ir}. With
    `device_only`, only inside the device's entry: each of
    DEVICE_ENTRIES is tried and the one that collects most kept (if the
    build inlined `SoftDevice::step` into the perf loop, a toggle on it
    collects next to nothing)."""
    best = None
    for entry in DEVICE_ENTRIES if device_only else (None,):
        out = os.path.join(d, f"cg.{ios}.{int(device_only)}.out")
        vg = ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={out}"]
        if entry:
            vg.append(f"--toggle-collect={entry}")
        p = subprocess.run(vg + cmd + ["--io-count", str(ios)], capture_output=True, text=True,
                           timeout=3600)
        if p.returncode != 0:
            sys.exit(f"callgrind failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
        c = parse(out)
        if best is None or sum(c.values()) > sum(best.values()):
            best = c
    if device_only and sum(best.values()) == 0:
        sys.exit("no device entry was called: is the run --inline?")
    return best


def parse(path):
    """Self cost per instruction address of a callgrind file written with
    --dump-instr=yes (positions: instr line); call cost lines (after
    `calls=`) are inclusive costs of the callee and are skipped."""
    names = {}
    costs = collections.Counter()
    ob = None
    addr = 0
    skip_next = False
    for line in open(path):
        c = line[0] if line else ""
        if c.isdigit() or c in "+-*" or line.startswith("0x"):
            parts = line.split()
            a = parts[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] == "+":
                addr += int(a[1:], 16) if a[1:].startswith("0x") else int(a[1:])
            elif a[0] == "-":
                addr -= int(a[1:], 16) if a[1:].startswith("0x") else int(a[1:])
            elif a != "*":
                addr = int(a, 0)
            if skip_next:
                skip_next = False
                continue
            if len(parts) >= 3:
                costs[(ob, addr)] += int(parts[2])
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        m = re.match(r"(ob|cob)=\((\d+)\)(?: (.*))?", line)
        if m:
            k, i, name = m.groups()
            if name:
                names[i] = name.strip()
            if k == "ob":
                ob = names.get(i, i)
    return costs


def costs(cmd, lo, hi):
    """(HI - LO) per address: (host, device), host = whole - device."""
    with tempfile.TemporaryDirectory() as d:
        runs = {}
        for ios in (lo, hi):
            for dev in (False, True):
                runs[(ios, dev)] = callgrind(cmd, ios, dev, d)
    host, device = collections.Counter(), collections.Counter()
    for sign, ios in ((1, hi), (-1, lo)):
        for k, v in runs[(ios, False)].items():
            host[k] += sign * v
        for k, v in runs[(ios, True)].items():
            host[k] -= sign * v
            device[k] += sign * v
    return host, device


def symbolize(binary, addrs):
    """addr -> inline chain [(function, file, line)], innermost first."""
    chains = {}
    if not addrs:
        return chains
    p = subprocess.run(["addr2line", "-a", "-f", "-i", "-C", "-e", binary],
                       input="\n".join(hex(a) for a in addrs), capture_output=True, text=True)
    cur = None
    lines = p.stdout.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("0x"):
            cur = int(ln, 16)
            chains[cur] = []
            i += 1
            continue
        fn = ln
        loc = lines[i + 1] if i + 1 < len(lines) else "??:0"
        f, _, l = loc.rpartition(":")
        chains[cur].append((fn, f, l.split()[0] if l else "0"))
        i += 2
    return chains


def crate_of(path):
    m = re.search(r"/crates/([^/]+)/", path)
    return m.group(1) if m else None


def owner(chain):
    """The innermost frame in a crate of this workspace, else None."""
    for fn, f, line in chain:
        c = crate_of(f)
        if c:
            return c, fn, f, line
    return None


def attribute(binary, costs, ios):
    """Rows (crate, function, file, cost per I/O) for each address."""
    exe = os.path.realpath(binary)
    addrs = [a for (ob, a), v in costs.items() if v and ob and os.path.realpath(ob) == exe]
    chains = symbolize(binary, addrs)
    rows = []
    for (ob, a), v in costs.items():
        if not v:
            continue
        if ob and os.path.realpath(ob) == exe:
            o = owner(chains.get(a, []))
            if o:
                c, fn, f, line = o
                if line in ("?", "0"):
                    # Code the compiler merged from several places (the
                    # line table says line 0): its inline chain stops at
                    # the merge, so the owner is not known.
                    c, f = "unknown", f + ":?"
                rows.append((c, fn, re.sub(r".*/crates/", "", f), v / ios))
            else:
                ch = chains.get(a) or [("??", "??", "0")]
                rows.append(("other", ch[-1][0], re.sub(r"/rustc/[0-9a-f]+/library/", "std:", ch[0][1]), v / ios))
        else:
            rows.append(("other", os.path.basename(ob or "?"), os.path.basename(ob or "?"), v / ios))
    return rows


def listing(binary, host, n):
    """Prints the host's instructions run at least 0.2 times per I/O, by
    address: cost per I/O, disassembly (objdump), innermost workspace
    source line and function."""
    exe = os.path.realpath(binary)
    per = collections.Counter()
    for (ob, a), v in host.items():
        if ob and os.path.realpath(ob) == exe:
            per[a] += v / n
    addrs = sorted(a for a, v in per.items() if abs(v) >= 0.2)
    if not addrs:
        return
    chains = symbolize(binary, addrs)
    dis = {}
    start = prev = addrs[0]
    for a in addrs[1:] + [None]:
        if a is None or a - prev > 4096:
            out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "intel",
                                  f"--start-address={start}", f"--stop-address={prev + 16}", binary],
                                 capture_output=True, text=True).stdout
            for ln in out.splitlines():
                m = re.match(r"\s*([0-9a-f]+):\s*(.*)", ln)
                if m:
                    dis[int(m.group(1), 16)] = m.group(2).strip()
            start = a
        if a is not None:
            prev = a
    for a in addrs:
        o = owner(chains.get(a, []))
        loc = f"{re.sub(r'.*/crates/', '', o[2])}:{o[3]} {short(o[1]).split('::')[-1]}" if o else "?"
        print(f"{per[a]:6.2f} {a:x}  {dis.get(a, '?')[:50]:50} {loc}")
    print(f"listed {sum(per[a] for a in addrs):.2f} per I/O")


def short(fn):
    """A function name without its generic arguments."""
    out, depth = [], 0
    for ch in fn:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).replace("::::", "::")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "target", "release", "pollux"))
    ap.add_argument("--qd", type=int, default=128)
    ap.add_argument("--lo", type=int, default=20000)
    ap.add_argument("--hi", type=int, default=60000)
    ap.add_argument("--files", action="store_true")
    ap.add_argument("--functions", type=int, default=0)
    ap.add_argument("--bdevperf", action="store_true", help="measure `pollux bdevperf` instead of perf")
    ap.add_argument("--listing", action="store_true",
                    help="every host instruction run at least 0.2 times per I/O, in address order, "
                         "with its cost, disassembly and innermost workspace line")
    a = ap.parse_args()
    n = a.hi - a.lo
    cmd = bdevperf_cmd(a.binary, a.qd) if a.bdevperf else perf_cmd(a.binary, a.qd)
    host = costs(cmd, a.lo, a.hi)[0]
    rows = attribute(a.binary, host, n)
    if a.listing:
        listing(a.binary, host, n)
    total = sum(r[3] for r in rows)
    by = collections.Counter()
    for c, _, _, v in rows:
        by["driver" if c in DRIVER else "perf loop" if c == "cli" else c if c == "unknown" else "other"] += v
    tool = "bdevperf" if a.bdevperf else "perf"
    print(f"{a.binary}: {tool} --inline QD {a.qd} 4 KiB randread, ({a.hi} - {a.lo}) / {n} I/Os, host only")
    print(f"host total {total:.2f} instructions per I/O")
    for k in ("driver", "perf loop", "unknown", "other"):
        print(f"  {k:10} {by[k]:7.2f}  ({by[k] / total:.1%})")
    crates = collections.Counter()
    for c, _, _, v in rows:
        crates[c] += v
    print("  by crate: " + ", ".join(f"{c} {v:.2f}" for c, v in crates.most_common() if abs(v) >= 0.05))
    if a.files:
        files = collections.Counter()
        for c, _, f, v in rows:
            files[f] += v
        print("by source file:")
        for f, v in files.most_common():
            if abs(v) >= 0.05:
                print(f"  {v:7.2f}  {f}")
    if a.functions:
        fns = collections.Counter()
        for c, fn, _, v in rows:
            fns[(c, short(fn))] += v
        print(f"top {a.functions} functions (innermost workspace frame):")
        for (c, fn), v in fns.most_common(a.functions):
            print(f"  {v:7.2f}  {c:6} {fn}")


if __name__ == "__main__":
    main()
