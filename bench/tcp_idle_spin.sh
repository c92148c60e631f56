#!/bin/bash
# The target's spin before sleeping at QD 1: one pollux binary, target on
# core 0 (null namespace) with --idle-spin 0 (sleep in epoll as soon as a
# pass finds nothing: a wake-up per command) and the default (200 us),
# rounds alternating, pollux perf QD 1 4 KiB randread on core 1. Per run:
# IOPS, p50 latency and the target thread's sleeps (voluntary context
# switches) per I/O; prints spin/no-spin ratios from one run.
#   bench/tcp_idle_spin.sh BIN [ROUNDS] [SECS] [SPIN_US]
set -u
B=$1; R=${2:-3}; S=${3:-3}; SPIN=${4:-200}; PORT=${PORT:-4490}; NQN=nqn.2016-06.io.pollux:spin
OUT=${OUT:-/tmp/tcp-spin/$(date +%H%M%S)}; mkdir -p "$OUT"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
cs() { cat /proc/$1/task/*/status | awk '/^voluntary_ctxt_switches/ {s+=$2} END {print s}'; }
echo "round spin iops p50_us sleeps_per_io" > $OUT/rows
for r in $(seq $R); do
  for sp in 0 $SPIN; do
    "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 \
      -r $OUT/rpc.sock --idle-spin $sp >$OUT/t.log 2>&1 & T=$!
    up || { kill $T; exit 1; }
    a=$(cs $T)
    timeout 60 "$B" perf -c 1 -r "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN" \
      -q 1 -o 4096 -w randread -t $S -L --json >$OUT/p.json 2>/dev/null
    b=$(cs $T); kill -INT $T; wait $T
    python3 - "$OUT/p.json" $r $sp $((b-a)) $S <<'P' | tee -a $OUT/rows
import json, sys
t = json.load(open(sys.argv[1]))["total"]
n = t["iops"] * float(sys.argv[5])
print(sys.argv[2], sys.argv[3], round(t["iops"]), t.get("p50_lat_us"), f"{int(sys.argv[4]) / max(n, 1):.4f}")
P
  done
done
python3 - $OUT/rows $SPIN <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().split("\n")[1:]:
    if l.strip(): r, sp, i, p, s = l.split(); d[r][sp] = (float(i), float(p) if p != "None" else None, float(s))
on = sys.argv[2]
x = [d[r][on][0] / d[r]["0"][0] for r in d if on in d[r] and "0" in d[r] and d[r]["0"][0]]
y = [d[r][on][1] / d[r]["0"][1] for r in d if on in d[r] and "0" in d[r] and d[r]["0"][1] and d[r][on][1]]
for sp in ("0", on):
    s = [d[r][sp][2] for r in d if sp in d[r]]
    print(f"idle-spin {sp} us: target sleeps per I/O median {st.median(s):.4f} (range {min(s):.4f}-{max(s):.4f})")
if x: print(f"QD 1 IOPS spin {on} / spin 0: median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
if y: print(f"QD 1 p50 latency spin {on} / spin 0: median {st.median(y):.3f} (range {min(y):.3f}-{max(y):.3f}, n={len(y)})")
P
