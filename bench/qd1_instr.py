#!/usr/bin/env python3
"""Where one QD 1 round goes, in instructions (deterministic: callgrind).

`pollux perf --inline -q 1` over the emulated controller (null backend,
4 KiB randread): (run of N2 I/Os - run of N1 I/Os) / (N2 - N1), by
function, the host and the emulated device apart. The device is what
runs inside `SoftDevice::step` (callgrind --toggle-collect); the host is
the rest. A QD 1 round also holds the polls that find nothing (the inline
device completes a command one step after it is submitted), so the table
shows what each I/O costs in polls and steps as well as in work.

Each instruction is attributed to the innermost frame of its inline chain
that lies in a crate of this workspace (bench/instr_split.py), and listed
by that function.

With --listing, also the device's instructions run at least 0.2 times
per round, by address (instr_split.py's listing of the device's costs).

Usage: bench/qd1_instr.py [BIN] [--n1 5000] [--n2 15000] [--top 25] [--listing]"""
import argparse
import collections
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("instr_split", os.path.join(HERE, "instr_split.py"))
split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split)


def table(title, rows, top):
    total = sum(r[3] for r in rows)
    fns = collections.Counter()
    crates = collections.Counter()
    for c, fn, _, v in rows:
        fns[(c, split.short(fn))] += v
        crates[c] += v
    print(f"{title}: {total:.1f} instructions per QD 1 round")
    print("  by crate: " + ", ".join(f"{c} {v:.1f}" for c, v in crates.most_common() if abs(v) >= 0.05))
    print(f"  {'instr':>7} {'share':>6}  crate   function (innermost workspace frame)")
    shown = 0.0
    for (c, fn), v in fns.most_common(top):
        shown += v
        print(f"  {v:7.1f} {v / total:6.1%}  {c:7} {fn}")
    print(f"  {total - shown:7.1f} {(total - shown) / total:6.1%}  (the rest)")
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(split.ROOT, "target", "release", "pollux"))
    ap.add_argument("--n1", type=int, default=5000)
    ap.add_argument("--n2", type=int, default=15000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--listing", action="store_true",
                    help="the device's instructions run at least 0.2 times per round, in address "
                         "order, with cost, disassembly and innermost workspace line")
    a = ap.parse_args()
    n = a.n2 - a.n1
    cmd = split.perf_cmd(a.binary, 1)
    hc, dc = split.costs(cmd, a.n1, a.n2)
    host = split.attribute(a.binary, hc, n)
    dev = split.attribute(a.binary, dc, n)
    print(f"{a.binary}: perf --inline -q 1, 4 KiB randread, ({a.n2} - {a.n1}) / {n} I/Os")
    h = table("host", host, a.top)
    d = table("emulated device (SoftDevice::step and below)", dev, a.top)
    if a.listing:
        split.listing(a.binary, dc, n)
    print(f"one QD 1 round: {h + d:.1f} instructions, host {h:.1f} ({h / (h + d):.1%}), "
          f"device {d:.1f} ({d / (h + d):.1%})")


if __name__ == "__main__":
    main()
