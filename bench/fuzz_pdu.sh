#!/usr/bin/env bash
# Runs the NVMe/TCP PDU header checker and parser over many random and
# mutated PDUs (crates/spec/tests/tcp.rs, test fuzz_pdus: half are valid
# PDUs from the builders with 0-3 header bits flipped, half random bytes,
# each under a random receiver configuration) and prints how many cases ran
# and how long the loop took. Fails if any case panics or breaks a layout
# invariant.
#
#   bench/fuzz_pdu.sh [CASES] [SEED]     (default 1000000 cases)
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-1000000}"
seed="${2:-11400714819323198485}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo build -j 1 --release -p pollux-spec --tests --quiet
status=0
POLLUX_FUZZ_CASES="$cases" POLLUX_FUZZ_SEED="$seed" \
	cargo test -j 1 --release -p pollux-spec --test tcp --quiet fuzz_pdus -- --exact --nocapture \
	>"$out" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
	cat "$out"
	echo "fuzz_pdu: FAILED (seed $seed)" >&2
	exit "$status"
fi
grep -E "^fuzz_pdus:" "$out"
echo "fuzz_pdu: passed"
