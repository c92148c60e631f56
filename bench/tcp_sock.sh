#!/bin/bash
# The target's socket implementations (and their variants) in one interleaved run:
# per round a fresh target per variant (core 0, null namespace of 4 KiB blocks; the
# order rotates by round), each driven by pollux perf on core 1. Default: posix against
# uring; 4 KiB randread at QD 1 and QD 127, 128 KiB randread at QD 32. Prints IOPS per
# row, each variant over each one before it in VARIANTS per round, and per workload the
# median and range of those ratios, with the cross-core round trip (pollux pingpong) before and after.
#   bench/tcp_sock.sh [BINARY] [ROUNDS] [SECS]
# env: OUT, PORT; UFLAGS / PFLAGS: more flags for the variants named uring / posix;
#   VARIANTS: words NAME or NAME=IMPL,FLAG,FLAG... (the first is the baseline), e.g.
#     VARIANTS="posix uring zc=uring,--uring-zcopy-threshold,65536"
#   WORKLOADS: words QD:BYTES, e.g. WORKLOADS="32:131072 128:4096"
# Wrap timed runs in `flock /tmp/bench.lock`.
set -u
B=${1:-target/release/pollux}; R=${2:-5}; S=${3:-3}; PORT=${PORT:-4471}
OUT=${OUT:-/tmp/tcp-sock/$(date +%H%M%S)}; mkdir -p "$OUT"
VARIANTS=${VARIANTS:-posix uring}; WORKLOADS=${WORKLOADS:-1:4096 127:4096 32:131072}
NQN=nqn.2016-06.io.spdk:cnode1
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start() { # VARIANT
  local name=${1%%=*} spec impl flags=()
  if [ "$name" = "$1" ]; then
    impl=$name
    [ $impl = uring ] && flags=(${UFLAGS:-})
    [ $impl = posix ] && flags=(${PFLAGS:-})
  else
    spec=${1#*=}; IFS=, read -r -a flags <<<"$spec"; impl=${flags[0]}; flags=("${flags[@]:1}")
  fi
  "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 \
    -r $OUT/rpc.sock --sock-impl "$impl" "${flags[@]}" >$OUT/t-$name.log 2>&1 & TP=$!; up; }
stop() { kill $TP 2>/dev/null; wait $TP 2>/dev/null; sleep 0.3; }
perf() { # QD SIZE
  timeout 60 taskset -c 1 "$B" perf -c 1 -r "$TRP" -q $1 -o $2 -w randread -t $S --json >$OUT/last.json 2>/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["iops"])' $OUT/last.json 2>/dev/null || echo NaN; }
rt() { "$B" pingpong --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["round_trip_ns"])' 2>/dev/null || echo NaN; }
echo "round trip before: $(rt) ns"
echo "round variant workload iops" > $OUT/rows
read -r -a vs <<<"$VARIANTS"; n=${#vs[@]}
for r in $(seq $R); do
  for k in $(seq 0 $((n - 1))); do
    v=${vs[$(( (k + r - 1) % n ))]}
    start "$v"
    for w in $WORKLOADS; do
      qd=${w%%:*}; sz=${w#*:}
      echo "$r ${v%%=*} qd$qd-$((sz / 1024))k $(perf $qd $sz)" | tee -a $OUT/rows
    done
    stop
  done
done
echo "round trip after: $(rt) ns"
python3 - $OUT/rows "${vs[0]%%=*}" <<'P'
import sys, statistics as st, collections
base = sys.argv[2]
d = collections.defaultdict(dict)
names = []
for l in open(sys.argv[1]).read().splitlines()[1:]:
    try:
        r, i, w, v = l.split(); d[(w, r)][i] = float(v)
        if i not in names: names.append(i)
    except ValueError:
        pass
pairs = [(b, o) for k, b in enumerate(names) for o in names[k + 1:]]
pairs.sort(key=lambda p: p[0] != base)
for w in sorted({k[0] for k in d}, key=lambda s: (s.split("-")[1], int(s[2:].split("-")[0]))):
    for base, other in pairs:
        x = []
        for (ww, r), v in sorted(d.items(), key=lambda kv: int(kv[0][1])):
            if ww == w and v.get(base) and v.get(other):
                x.append(v[other] / v[base])
                print(f"  {w} round {r}: {base} {v[base]:.0f}  {other} {v[other]:.0f}  {other}/{base} {x[-1]:.3f}")
        if x:
            print(f"{w}: {other}/{base} median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
P
