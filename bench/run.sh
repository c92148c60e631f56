#!/usr/bin/env bash
# Builds pollux (release) and runs the hot-path benchmark (bench/bench.py):
# IOPS median/range, technique on/off ratios, doorbells per I/O, QD1 latency
# vs the cross-core round trip, callgrind instructions per I/O.
#   bench/run.sh [--quick] [--runs N] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh
if ! command -v valgrind >/dev/null && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
cargo build --release --locked -p pollux-cli
exec python3 bench/bench.py "$@"
