#!/usr/bin/env bash
# Builds pollux and the runtime examples (release) and runs the block-device
# layer / runtime benchmark (bench/bdev.py): null bdev IOPS, bdevperf vs perf,
# callgrind instructions per I/O, io_uring backend vs fio, idle CPU, the
# dynamic scheduler's effect.
#   bench/bdev.sh [--quick] [--runs N] [--json FILE] [--file PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh
if [[ $(id -u) -eq 0 ]]; then
    need=()
    command -v valgrind >/dev/null || need+=(valgrind)
    command -v fio >/dev/null || need+=(fio)
    if ((${#need[@]})); then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi
cargo build --release --locked -p pollux-cli
cargo build --release --locked -p pollux-runtime --example idle_cpu --example scheduler_load
exec python3 bench/bdev.py "$@"
