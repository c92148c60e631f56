#!/bin/bash
# The target's socket implementations, posix against uring, in one interleaved run:
# per round a fresh target per implementation (core 0, null namespace of 4 KiB
# blocks; which goes first alternates by round), each driven by pollux perf on core 1:
# 4 KiB randread at QD 1 and QD 127, 128 KiB randread at QD 32. Prints IOPS per row,
# uring/posix per round, and per workload the median and range of uring/posix, with
# the cross-core round trip (pollux pingpong) before and after.
#   bench/tcp_sock.sh [BINARY] [ROUNDS] [SECS]   (env: OUT, PORT, UFLAGS: more uring flags,
#                                                  PFLAGS: more posix flags)
# Wrap timed runs in `flock /tmp/bench.lock`.
set -u
B=${1:-target/release/pollux}; R=${2:-5}; S=${3:-3}; PORT=${PORT:-4471}
OUT=${OUT:-/tmp/tcp-sock/$(date +%H%M%S)}; mkdir -p "$OUT"
NQN=nqn.2016-06.io.spdk:cnode1
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start() { # IMPL [flags]
  local impl=$1; shift
  "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 \
    -r $OUT/rpc.sock --sock-impl "$impl" "$@" >$OUT/t-$impl.log 2>&1 & TP=$!; up; }
stop() { kill $TP 2>/dev/null; wait $TP 2>/dev/null; sleep 0.3; }
perf() { # QD SIZE
  timeout 60 taskset -c 1 "$B" perf -c 1 -r "$TRP" -q $1 -o $2 -w randread -t $S --json >$OUT/last.json 2>/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["iops"])' $OUT/last.json 2>/dev/null || echo NaN; }
rt() { "$B" pingpong --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["round_trip_ns"])' 2>/dev/null || echo NaN; }
echo "round trip before: $(rt) ns"
echo "round impl workload iops" > $OUT/rows
for r in $(seq $R); do
  order="posix uring"; [ $((r % 2)) = 0 ] && order="uring posix"
  for impl in $order; do
    if [ $impl = uring ]; then start uring ${UFLAGS:-}; else start posix ${PFLAGS:-}; fi
    for w in "1 4096" "127 4096" "32 131072"; do
      set -- $w
      echo "$r $impl qd$1-$(($2 / 1024))k $(perf $1 $2)" | tee -a $OUT/rows
    done
    stop
  done
done
echo "round trip after: $(rt) ns"
python3 - $OUT/rows <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().splitlines()[1:]:
    try:
        r, i, w, v = l.split(); d[(w, r)][i] = float(v)
    except ValueError:
        pass
for w in sorted({k[0] for k in d}, key=lambda s: (s.split("-")[1], int(s[2:].split("-")[0]))):
    x = []
    for (ww, r), v in sorted(d.items(), key=lambda kv: int(kv[0][1])):
        if ww == w and v.get("posix") and v.get("uring"):
            x.append(v["uring"] / v["posix"])
            print(f"  {w} round {r}: posix {v['posix']:.0f}  uring {v['uring']:.0f}  uring/posix {x[-1]:.3f}")
    if x:
        print(f"{w}: uring/posix median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
P
