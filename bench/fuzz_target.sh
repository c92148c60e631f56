#!/usr/bin/env bash
# Runs the NVMe/TCP target's connection machine over many structured,
# mutated PDU sequences (crates/nvmf/tests/fuzz/, test fuzz_conn): each
# case is one connection driven over memory by a host model (ICReq,
# Connect, capsules, in-capsule and R2T/H2CData writes, reads, Keep Alive,
# Disconnect, and mutations: truncation, oversized PLEN, wrong order, stray
# H2CData, bit flips in headers and SQEs, digests, garbage, a host that
# never reads, reset), checking no panic, the predicted C2HTermReq FES/FEI,
# every command completed, data read back, bounded memory. Prints cases,
# accepted/terminated counts and time. Fails if any case fails (the message
# names the case and seed).
#
#   bench/fuzz_target.sh [CASES] [SEED]     (default 1000000 cases)
#
# Then, with HOSTILE=1, the hostile-connection test in release
# (crates/nvmf/tests/hostile.rs) with POLLUX_HOSTILE_CONNS connections
# (default 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-1000000}"
seed="${2:-104372259944167}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo build -j 1 --release -p pollux-nvmf --tests --quiet
status=0
POLLUX_FUZZ_CASES="$cases" POLLUX_FUZZ_SEED="$seed" \
	cargo test -j 1 --release -p pollux-nvmf --test fuzz --quiet fuzz_conn -- --exact --nocapture \
	>"$out" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
	cat "$out"
	echo "fuzz_target: FAILED (seed $seed)" >&2
	exit "$status"
fi
grep -E "^fuzz_conn:" "$out"
echo "fuzz_target: passed"
if [ "${HOSTILE:-0}" = 1 ]; then
	POLLUX_HOSTILE_CONNS="${POLLUX_HOSTILE_CONNS:-20000}" \
		cargo test -j 1 --release -p pollux-nvmf --test hostile --quiet -- --nocapture 2>&1 |
		grep -E "^hostile:|test result"
fi
