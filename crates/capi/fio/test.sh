#!/usr/bin/env bash
# fio's own verification (verify=crc32c: write, then read back and check)
# through the pollux ioengine, on the emulated controller and over NVMe/TCP
# to a `pollux target` this script starts; asserts fio reports zero errors
# and verified every block it wrote. And a job that must fail: the null
# backend stores nothing, so verification reports errors (the check can
# fail). Run by scripts/test.sh; builds what it needs (debug profile).
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --locked -q -p pollux-capi -p pollux-cli
engine=$(crates/capi/fio/build.sh | tail -1)
work=$(mktemp -d)
tpid=
cleanup() {
    [[ -n $tpid ]] && kill "$tpid" 2>/dev/null && wait "$tpid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# fio with the engine on filename $1 (':' escaped), JSON to $work/$2.json.
run_fio() {
    fio --output-format=json --output="$work/$2.json" --thread=1 \
        --ioengine=external:"$engine" --filename="$1" --name="$2" \
        --rw=randwrite --bs=4k --iodepth=16 --size=8MiB --verify=crc32c \
        --do_verify=1 --verify_state_save=0 >"$work/$2.out" 2>&1
}

# Zero errors, and as many bytes read back (verified) as written.
check() {
    python3 - "$work/$1.json" "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
w, r = j["write"]["io_bytes"], j["read"]["io_bytes"]
assert j["error"] == 0, f"{sys.argv[2]}: fio error {j['error']}"
assert w > 0 and r == w, f"{sys.argv[2]}: wrote {w} bytes, verified {r}"
print(f"fio verify {sys.argv[2]}: {w} bytes written and verified, 0 errors")
PY
}

run_fio 'trtype\:soft backend\:ram size\:64MiB' soft || { cat "$work/soft.out"; exit 1; }
check soft

# The target on a free port; its first line says which.
target/debug/pollux target --ram 64MiB --listen 127.0.0.1:0 -r "$work/rpc.sock" >"$work/target.out" 2>&1 &
tpid=$!
for _ in $(seq 100); do
    addr=$(sed -n 's/^pollux target: listening on //p' "$work/target.out")
    [[ -n $addr ]] && break
    sleep 0.1
done
[[ -n $addr ]] || { echo "pollux target did not start:"; cat "$work/target.out"; exit 1; }
port=${addr##*:}
# '+' for spaces (the engine reads it as one).
run_fio "trtype\\:tcp+traddr\\:127.0.0.1+trsvcid\\:$port+subnqn\\:nqn.2016-06.io.pollux\\:cnode1" tcp ||
    { cat "$work/tcp.out"; exit 1; }
check tcp

# Must fail: nothing stored, so fio's verification finds bad blocks.
if run_fio 'trtype\:soft backend\:null size\:64MiB' null; then
    echo "fio verify on the null backend passed: verification is not checking"
    exit 1
fi
grep -q "verify: bad header" "$work/null.out" || { cat "$work/null.out"; exit 1; }
echo "fio verify null backend: failed as it must"
