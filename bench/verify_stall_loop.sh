#!/bin/bash
# Issue 23 item 5: loops `pollux bdevperf --nvme 'trtype:soft backend:ram
# size:1GiB' -w verify -t T` and counts the seconds at (near) 0 IOPS (under
# 1% of the run's median second) and how many of them carry the note that
# names a polling thread held off its core. On a quiet machine none show;
# start a load beside it (a guest, a build, or HOG=1: two spinners, one per
# core, during every other run) to see them.
#
#   bench/verify_stall_loop.sh [RUNS] [SECONDS]       (POLLUX=path, HOG=1)
set -euo pipefail
RUNS=${1:-100}
T=${2:-2}
POLLUX=${POLLUX:-target/release/pollux}
[ -x "$POLLUX" ] || cargo build --release -p pollux-cli
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null || true' EXIT
runs=0 slow=0 zero=0 noted=0
for i in $(seq 1 "$RUNS"); do
    hogs=()
    if [ "${HOG:-0}" = 1 ] && [ $((i % 2)) = 0 ]; then
        for c in $(seq 0 $(($(nproc) - 1))); do
            taskset -c "$c" sh -c 'while :; do :; done' & hogs+=($!)
        done
    fi
    start=$(date +%s.%N)
    "$POLLUX" bdevperf -r "$tmp/rpc.sock" --nvme 'trtype:soft backend:ram size:1GiB' -w verify -t "$T" \
        > "$tmp/out" 2> "$tmp/err" || echo "run $i: exit $?"
    end=$(date +%s.%N)
    [ ${#hogs[@]} = 0 ] || kill "${hogs[@]}" 2>/dev/null || true
    runs=$((runs + 1))
    python3 - "$tmp/err" "$start" "$end" "$T" <<'PY' > "$tmp/r"
import re, statistics, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('[')]
iops = [float(re.search(r'\]\s+([\d.]+) IOPS', l).group(1)) for l in lines]
med = statistics.median(iops) if iops else 0
zero = [l for l, v in zip(lines, iops) if v < 0.01 * med]
noted = [l for l in zero if 'note:' in l]
slow = float(sys.argv[3]) - float(sys.argv[2]) > 1.5 * float(sys.argv[4]) + 1
print(len(zero), len(noted), int(slow))
PY
    read -r z n s < "$tmp/r"
    zero=$((zero + z)); noted=$((noted + n)); slow=$((slow + s))
    [ "$z" = 0 ] || { echo "run $i: $z second(s) near 0 IOPS, $n with a note:"; grep '^\[' "$tmp/err"; }
done
echo "runs: $runs  slow (wall > 1.5 x -t + 1 s): $slow  seconds near 0 IOPS: $zero  of them with a note: $noted"
