#!/bin/bash
# ../shared/spdk/tcp_side_by_side.sh for two pollux binaries in one interleaved run:
# per round, SPDK nvmf_tgt, then the BEFORE pollux target, then the AFTER one (fresh
# process each, core 0, null namespace of 4 KiB blocks), each driven on core 1 by
# SPDK's spdk_nvme_perf and by pollux perf (the SPDK target by both pollux perfs).
# Prints, per client and queue depth, pollux target / SPDK target per round for the
# before and after binaries (each ratio under the binary's own perf as pollux client,
# or under CLIENT's perf for both when CLIENT names a pollux binary: then only the
# targets differ).
#   bench/tcp_before_after.sh BEFORE AFTER [ROUNDS] [SECS]   (env: SPDK_DIR, OUT, PQD, CLIENT)
set -u
SP=${SPDK_DIR:-/tmp/spdk}; B0=$1; B1=$2; R=${3:-5}; S=${4:-4}; PQD=${PQD:-128}
OUT=${OUT:-/tmp/tcp-ba/$(date +%H%M%S)}; mkdir -p "$OUT"
[ -x "$SP/build/bin/nvmf_tgt" ] || { echo "no SPDK build at $SP (../shared/spdk/build.sh)" >&2; exit 2; }
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge 1024 ] || echo 1024 > /proc/sys/vm/nr_hugepages
mount | grep -q 'type hugetlbfs' || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }
NQN=nqn.2016-06.io.spdk:cnode1; PORT=4461
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start_spdk() {
  $SP/build/bin/nvmf_tgt -m 0x1 -r $OUT/spdk.sock >$OUT/st.log 2>&1 & TP=$!
  for _ in $(seq 100); do [ -S $OUT/spdk.sock ] && break; sleep 0.1; done; sleep 0.5
  local RPC="/usr/bin/python3 $SP/scripts/rpc.py -s $OUT/spdk.sock"
  $RPC nvmf_create_transport -t TCP >/dev/null; $RPC bdev_null_create Null0 1024 4096 >/dev/null
  $RPC nvmf_create_subsystem $NQN -a -s SPDK00000000000001 >/dev/null; $RPC nvmf_subsystem_add_ns $NQN Null0 >/dev/null
  $RPC nvmf_subsystem_add_listener $NQN -t tcp -a 127.0.0.1 -s $PORT -f ipv4 >/dev/null; up
}
start_pollux() { "$1" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 >$OUT/pt.log 2>&1 & TP=$!; up; }
stop() { kill $TP 2>/dev/null; wait $TP 2>/dev/null; rm -f $OUT/spdk.sock; sleep 0.5; }
TRS="trtype:tcp adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN hostnqn:nqn.2014-08.org.nvmexpress:uuid:12a79949-9a45-41fa-85c6-a7381d014ef3"
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
sperf() { timeout 60 $SP/build/bin/spdk_nvme_perf -c 0x2 -r "$TRS" -q $1 -o 4096 -w randread -t $S >$OUT/last.out 2>&1
          awk '/^Total *:/ {print $3; exit}' $OUT/last.out; }
pperf() { timeout 60 "${CLIENT:-$1}" perf -c 1 -r "$TRP" -q $2 -o 4096 -w randread -t $S --json >$OUT/last.json 2>/dev/null
          python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total"]["iops"])' $OUT/last.json 2>/dev/null; }
echo "round target client qd iops" > $OUT/rows
row() { echo "$*" | tee -a $OUT/rows; }
for r in $(seq $R); do
  start_spdk
  for q in 128 1; do row $r spdk spdk $q $(sperf $q); done
  for q in $PQD 1; do row $r spdk before $q $(pperf $B0 $q); row $r spdk after $q $(pperf $B1 $q); done
  stop
  for w in before after; do
    [ $w = before ] && b=$B0 || b=$B1
    start_pollux $b
    for q in 128 1; do row $r $w spdk $q $(sperf $q); done
    for q in $PQD 1; do row $r $w $w $q $(pperf $b $q); done
    stop
  done
done
python3 - $OUT/rows <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().splitlines()[1:]:
    try: r, t, c, q, v = l.split(); d[(r, c, q)][t] = float(v)
    except ValueError: pass
for w in ("before", "after"):
    for c in ("spdk", w):
        for q in sorted({k[2] for k in d}, key=int, reverse=True):
            x = [d[k][w] / d[k]["spdk"] for k in d if k[1] == c and k[2] == q and w in d[k] and "spdk" in d[k]]
            if x:
                print(f"{w}: client={'SPDK perf' if c == 'spdk' else 'pollux perf'} qd={q}: pollux/SPDK target median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f}, n={len(x)})")
P
