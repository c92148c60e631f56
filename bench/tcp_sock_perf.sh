#!/bin/bash
# Where the target's core goes (kernel and user, by symbol) under each socket variant:
# per variant a fresh target (core 0, null namespace of 4 KiB blocks) driven by pollux
# perf on core 1, `perf record -e cpu-clock -a -g` over SECS in the middle of the run,
# then for the target's thread (pollux-tgt-0) the share of samples under each of KEYS
# (kernel functions: sends, pinning, the loopback's copy, receive, waits) and the top
# symbols by self time (bench/perf_stacks.py).
#   bench/tcp_sock_perf.sh [BINARY] [SECS]
# env: OUT, PORT, QD (32), SIZE (131072), TOP (15), KEYS; VARIANTS as bench/tcp_sock.sh's
#   (default: "uring zc=uring,--uring-zcopy-threshold,65536").
# Wrap in `flock /tmp/bench.lock`.
set -u
B=${1:-target/release/pollux}; S=${2:-4}; PORT=${PORT:-4472}; QD=${QD:-32}; SIZE=${SIZE:-131072}
OUT=${OUT:-/tmp/tcp-sock-perf/$(date +%H%M%S)}; mkdir -p "$OUT"
VARIANTS=${VARIANTS:-uring zc=uring,--uring-zcopy-threshold,65536}; TOP=${TOP:-15}
KEYS=${KEYS:-io_uring_enter,io_sendmsg,io_sendmsg_zc,tcp_sendmsg_locked,_copy_from_iter,zerocopy_fill_skb_from_iter,gup_fast_fallback,skb_copy_ubufs,net_rx_action,io_recv,io_cqring_wait,skb_release_data,tcp_ack,pollux_nvmf}
NQN=nqn.2016-06.io.spdk:cnode1
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
for v in $VARIANTS; do
  name=${v%%=*}
  if [ "$name" = "$v" ]; then impl=$name; flags=(); else
    IFS=, read -r -a flags <<<"${v#*=}"; impl=${flags[0]}; flags=("${flags[@]:1}"); fi
  "$B" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 \
    -r $OUT/rpc.sock --sock-impl "$impl" "${flags[@]}" >$OUT/t-$name.log 2>&1 & TP=$!; up
  taskset -c 1 "$B" perf -c 1 -r "$TRP" -q $QD -o $SIZE -w randread -t $((S + 2)) --json >$OUT/perf-$name.json 2>/dev/null & PP=$!
  sleep 1
  perf record -q -e cpu-clock -a -g -o $OUT/$name.data -- sleep $S >/dev/null 2>&1
  wait $PP; kill $TP; wait $TP 2>/dev/null; sleep 0.3
  iops=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["total"]["iops"]))' $OUT/perf-$name.json 2>/dev/null)
  echo "== $name: QD $QD, $SIZE bytes, $iops IOPS (under perf record); the target's thread"
  python3 "$(dirname "$0")/perf_stacks.py" $OUT/$name.data pollux-tgt-0 "$KEYS" $TOP
done
