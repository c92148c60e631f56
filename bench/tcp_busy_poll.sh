#!/bin/bash
# SO_BUSY_POLL on loopback: one pollux binary, target (core 0, null
# namespace) and pollux perf (core 1, 4 KiB randread), rounds alternating
# off (no option) and on (target --busy-poll US, host busy_poll:US); per
# run the IOPS, the target thread's sleeps (voluntary context switches)
# and the kernel's napi_poll events system-wide (busy polling shows as
# napi_poll calls; without a NAPI id, as on loopback, there are none more).
# Prints on/off IOPS ratios per queue depth from one run.
#   bench/tcp_busy_poll.sh BIN [ROUNDS] [SECS] [US]
set -u
B=$1; R=${2:-3}; S=${3:-3}; US=${4:-50}; PORT=${PORT:-4492}; NQN=nqn.2016-06.io.pollux:bp
OUT=${OUT:-/tmp/tcp-bp/$(date +%H%M%S)}; mkdir -p "$OUT"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
echo "round mode qd iops sleeps napi_poll" > $OUT/rows
for r in $(seq $R); do
  for m in off on; do
    [ $m = on ] && { TO="--busy-poll $US"; HO="busy_poll:$US"; } || { TO=""; HO=""; }
    for q in 1 128; do
      "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 $TO >$OUT/t.log 2>&1 & T=$!
      up || { kill $T; exit 1; }
      a=$(cat /proc/$T/task/*/status | awk '/^voluntary_ctxt_switches/ {s+=$2} END {print s}')
      perf stat -a -x, -e napi:napi_poll -o $OUT/napi -- \
        timeout 60 "$B" perf -c 1 -r "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN $HO" -q $q -o 4096 -w randread -t $S --json >$OUT/p.json 2>/dev/null
      b=$(cat /proc/$T/task/*/status | awk '/^voluntary_ctxt_switches/ {s+=$2} END {print s}')
      kill -INT $T; wait $T
      n=$(awk -F, '/napi_poll/ {print $1}' $OUT/napi)
      i=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["iops"])' $OUT/p.json 2>/dev/null || echo 0)
      echo "$r $m $q $i $((b-a)) $n" | tee -a $OUT/rows
    done
  done
done
python3 - $OUT/rows <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().split("\n")[1:]:
    if l.strip(): r, m, q, i, s, n = l.split(); d[(r, q)][m] = (float(i), int(s), n)
for q in ("1", "128"):
    x = [d[k]["on"][0] / d[k]["off"][0] for k in d if k[1] == q and d[k].get("off", (0,))[0]]
    if x: print(f"QD {q}: busy_poll on/off IOPS median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
P
