#!/bin/bash
# The host's socket implementations (transport-ID key sock_impl:posix|uring),
# in one interleaved run: per round a fresh `pollux target` (core 0, null
# namespace of 4 KiB blocks, --sock-impl $TSOCK, default posix), and per
# workload, back to back in an order that rotates by round, pollux perf on
# core 1 with the host on posix, on uring (PDUs parsed in the provided
# buffers), on uring copying them out first (uring_direct:0, "uringcopy"),
# and (if BASE names an older pollux binary) on that binary's posix: 4 KiB
# randread at QD 1 and QD 128, 128 KiB randread at QD 32. Prints IOPS per
# row, then per workload each ratio per round with its median and range,
# and the cross-core round trip (pollux pingpong) before and after.
#   bench/tcp_host_sock.sh [BINARY] [ROUNDS] [SECS]
#     env: BASE (older binary, host side only), TSOCK (target --sock-impl),
#          VARS (default "posix uring uringcopy"; also uring64k: 16 receive
#          buffers of 64 KiB),
#          OUT, PORT, PROFILE=1 (instead: `perf record -e cpu-clock -a -C 1 -g`
#          of one QD 128 4 KiB run per host implementation, top symbols)
# Wrap timed runs in `flock /tmp/bench.lock`.
set -u
B=${1:-target/release/pollux}; R=${2:-5}; S=${3:-3}; PORT=${PORT:-4473}
OUT=${OUT:-/tmp/tcp-host-sock/$(date +%H%M%S)}; mkdir -p "$OUT"
NQN=nqn.2016-06.io.spdk:cnode1
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start() {
  "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 \
    -r $OUT/rpc.sock --sock-impl "${TSOCK:-posix}" >$OUT/t.log 2>&1 & TP=$!; up; }
stop() { kill $TP 2>/dev/null; wait $TP 2>/dev/null; sleep 0.3; }
key_of() { # VARIANT: its transport-ID keys
  case $1 in
    base) echo "" ;;  # (an older binary may not know the keys)
    uringcopy) echo "sock_impl:uring uring_direct:0" ;;
    uring64k) echo "sock_impl:uring uring_rx_buffers:16 uring_rx_buffer_size:65536" ;;
    *) echo "sock_impl:$1" ;;
  esac; }
perf() { # VARIANT QD SIZE
  local bin=$B key; key=$(key_of $1)
  [ $1 = base ] && bin=$BASE
  timeout 60 taskset -c 1 "$bin" perf -c 1 -r "$TRP $key" -q $2 -o $3 -w randread -t $S --json >$OUT/last.json 2>$OUT/last.err
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["iops"])' $OUT/last.json 2>/dev/null || echo NaN; }
rt() { "$B" pingpong --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["round_trip_ns"])' 2>/dev/null || echo NaN; }
VARS=${VARS:-posix uring uringcopy}; [ -n "${BASE:-}" ] && VARS="$VARS base"
if [ -n "${PROFILE:-}" ]; then
  start
  for v in $VARS; do
    [ $v = base ] && continue
    k=$(key_of $v)
    command perf record -e cpu-clock -a -C 1 -g -o $OUT/perf-$v.data -- \
      taskset -c 1 "$B" perf -c 1 -r "$TRP $k" -q 128 -o 4096 -w randread -t $S >/dev/null 2>&1
    echo "== host sock_impl:$v (core 1), top symbols"
    command perf report -i $OUT/perf-$v.data --comm pollux --no-children --sort sym --stdio -g none 2>/dev/null \
      | grep -v '^#' | grep '%' | head -25
    command perf report -i $OUT/perf-$v.data --comm pollux --no-children --sort sym --stdio -g none 2>/dev/null \
      | grep '%' | grep -v '^#' | awk '{p=$1; sub("%","",p); if ($2=="[k]") k+=p; else u+=p}
        END {printf "pollux on core 1: kernel %.1f%%, user %.1f%% of the core'"'"'s samples\n", k, u}'
  done
  stop
  exit 0
fi
echo "round trip before: $(rt) ns"
echo "round variant workload iops" > $OUT/rows
set -- $VARS; NV=$#
for r in $(seq $R); do
  start
  # Per workload the variants back to back (this VM's speed drifts over
  # minutes), their order rotating by round.
  set -- $VARS; for _ in $(seq $(( (r - 1) % NV ))); do a=$1; shift; set -- "$@" $a; done
  order="$*"
  for w in "1 4096" "128 4096" "32 131072"; do
    set -- $w
    for v in $order; do
      echo "$r $v qd$1-$(($2 / 1024))k $(perf $v $1 $2)" | tee -a $OUT/rows
    done
  done
  stop
done
echo "round trip after: $(rt) ns"
python3 - $OUT/rows <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().splitlines()[1:]:
    try:
        r, v, w, x = l.split(); d[(w, r)][v] = float(x)
    except ValueError:
        pass
ws = sorted({k[0] for k in d}, key=lambda s: (s.split("-")[1], int(s[2:].split("-")[0])))
pairs = [(v, "posix") for v in ("uring", "uringcopy", "uring64k")] + [("uring", "uringcopy"), ("uring64k", "uring"), ("posix", "base")]
for num, den in pairs:
    for w in ws:
        x = []
        for (ww, r), v in sorted(d.items(), key=lambda kv: int(kv[0][1])):
            if ww == w and v.get(num, 0) > 0 and v.get(den, 0) > 0:
                x.append(v[num] / v[den])
                print(f"  {w} round {r}: {den} {v[den]:.0f}  {num} {v[num]:.0f}  {num}/{den} {x[-1]:.3f}")
        if x:
            print(f"{w}: {num}/{den} median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
P
