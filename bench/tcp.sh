#!/usr/bin/env bash
# Builds pollux (release) and runs the NVMe/TCP benchmark (bench/tcp.py):
# pollux target on one core vs pollux perf over trtype:tcp on the other,
# IOPS per target core, kernel/user split, QD 1 latency, and the on/off
# ratio of each of the target's techniques; where the time goes (perf
# cpu-clock samples), the target's user-space instructions per I/O
# (callgrind) and what the kernel alone moves over loopback.
#   bench/tcp.sh [--quick] [--runs N] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh
if ! command -v valgrind >/dev/null && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
cargo build --release --locked -p pollux-cli
cargo build --release --locked -p pollux-nvmf --example loopback_bound
exec python3 bench/tcp.py "$@"
