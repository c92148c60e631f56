#!/usr/bin/env python3
"""Where one thread's time goes in a `perf record -g` file: the share of its
samples whose call stack holds each of KEYS (inclusive, each sample counted
once, recursion or not), and the top symbols by self time.
  bench/perf_stacks.py PERF_DATA COMM KEY,KEY,... [TOP]"""
import sys, collections, subprocess
# perf script output with -F comm,tid,ip,sym: samples separated by blank lines
data, comm = sys.argv[1], sys.argv[2]
keys = sys.argv[3].split(",")
out = subprocess.run(["perf", "script", "-i", data, "--comm", comm, "-F", "comm,ip,sym"],
                     capture_output=True, text=True).stdout
n = 0
inc = collections.Counter(); selfc = collections.Counter()
for block in out.split("\n\n"):
    lines = [l.strip() for l in block.strip().split("\n") if l.strip()]
    if len(lines) < 2:
        continue
    n += 1
    syms = [l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "?" for l in lines[1:]]
    selfc[syms[0]] += 1
    seen = set(syms)
    for k in keys:
        if any(s == k or s.startswith(k + "+") or k in s for s in seen):
            inc[k] += 1
print(f"samples of {comm}: {n}")
print("inclusive (share of the thread's samples whose stack holds it):")
for k in keys:
    print(f"  {100*inc[k]/max(n,1):6.1f}%  {k}")
print("self, top:")
for s, c in selfc.most_common(int(sys.argv[4]) if len(sys.argv) > 4 else 15):
    print(f"  {100*c/n:6.1f}%  {s}")
