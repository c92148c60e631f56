#!/usr/bin/env bash
# Builds pollux (release) and runs the NVMe/TCP benchmark (bench/tcp.py):
# pollux target on one core vs pollux perf over trtype:tcp on the other,
# IOPS per target core, kernel/user split, QD 1 latency, and the on/off
# ratio of each of the target's techniques.
#   bench/tcp.sh [--quick] [--runs N] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh
cargo build --release --locked -p pollux-cli
exec python3 bench/tcp.py "$@"
