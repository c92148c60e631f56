#!/bin/bash
# One pollux target core (core 0, null namespace, 4 KiB randread) serving 1, 4
# and 16 connections from pollux perf on core 1: -P 1 -q 128; -P 4 -q 32 and
# -P 16 -q 8 (same total queue depth); -P 4 -q 128 and -P 16 -q 128 (each
# connection as deep as the single one); and 4 perf processes of -q 32 each
# (--interrupts: four polling processes on one core would share it in
# scheduler slices).
# Rounds alternate the binaries (each a fresh target per round); prints each
# case's aggregate IOPS / the same round's single-connection IOPS per binary.
#   bench/tcp_multi.sh BIN... [env: ROUNDS=3 SECS=3 CLIENT=bin TARGS="..."]
set -u
R=${ROUNDS:-3}; S=${SECS:-3}; PORT=${PORT:-4493}; NQN=nqn.2016-06.io.pollux:multi
OUT=${OUT:-/tmp/tcp-multi/$(date +%H%M%S)}; mkdir -p "$OUT"
TRP="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
up() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0; sleep 0.1; done; return 1; }
iops() { python3 -c 'import json,sys; print(sum(json.load(open(f))["total"]["iops"] for f in sys.argv[1:]))' "$@" 2>/dev/null || echo 0; }
perf() { # client P Q tag [perf options]
  timeout 60 "$1" perf -c 1 -r "$TRP" -P $2 -q $3 -o 4096 -w randread -t $S ${5:-} --json >$OUT/$4.json 2>$OUT/$4.err; }
echo "round bin case iops" > $OUT/rows
for r in $(seq $R); do
  for b in "$@"; do
    c=${CLIENT:-$b}
    "$b" target --listen 127.0.0.1:$PORT --null 1GiB --block-size 4096 --nqn $NQN -m 0x1 ${TARGS:-} >$OUT/t.log 2>&1 & T=$!
    up || { echo "target did not start" >&2; kill $T; exit 1; }
    perf $c 1 128 p1;  echo "$r $b P1 $(iops $OUT/p1.json)" | tee -a $OUT/rows
    perf $c 4 32 p4;   echo "$r $b P4 $(iops $OUT/p4.json)" | tee -a $OUT/rows
    perf $c 16 8 p16;  echo "$r $b P16 $(iops $OUT/p16.json)" | tee -a $OUT/rows
    perf $c 4 128 p4d;  echo "$r $b P4q128 $(iops $OUT/p4d.json)" | tee -a $OUT/rows
    perf $c 16 128 p16d;  echo "$r $b P16q128 $(iops $OUT/p16d.json)" | tee -a $OUT/rows
    PIDS=(); for k in 1 2 3 4; do perf $c 1 32 x$k --interrupts & PIDS+=($!); done; wait "${PIDS[@]}"
    echo "$r $b X4 $(iops $OUT/x1.json $OUT/x2.json $OUT/x3.json $OUT/x4.json)" | tee -a $OUT/rows
    kill -INT $T; wait $T
  done
done
python3 - $OUT/rows <<'P'
import sys, statistics as st, collections
d = collections.defaultdict(dict)
for l in open(sys.argv[1]).read().split("\n")[1:]:
    if l.strip(): r, b, c, v = l.split(); d[(r, b)][c] = float(v)
for b in dict.fromkeys(k[1] for k in d):
    for c in ("P1", "P4", "P16", "P4q128", "P16q128", "X4"):
        v = [d[k][c] for k in d if k[1] == b and c in d[k]]
        x = [d[k][c] / d[k]["P1"] for k in d if k[1] == b and d[k].get("P1")]
        print(f"{b} {c}: IOPS median {st.median(v):,.0f} (range {min(v):,.0f}-{max(v):,.0f}); / P1 median {st.median(x):.3f} (range {min(x):.3f}-{max(x):.3f})")
P
