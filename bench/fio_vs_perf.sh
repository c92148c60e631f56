#!/usr/bin/env bash
# fio + the pollux ioengine against `pollux perf` on the same emulated
# controller (null backend, the device on its own thread: fio cannot step
# it inline), runs interleaved; prints each side's IOPS (median and range),
# the fio/perf IOPS ratio per round, and the host thread's CPU time per
# I/O: fio's job thread (measured by the engine, POLLUX_FIO_CPU) and perf's
# worker core (its JSON cpu_s). Both host threads on core 0.
#
#   bench/fio_vs_perf.sh            # ROUNDS=3 T=5 QD=32 BS=4096
#   ROUNDS=5 T=10 QD=128 bench/fio_vs_perf.sh
#   FIO_OPTS="--gtod_reduce=1 --norandommap=1" bench/fio_vs_perf.sh  # fio's lean options
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh
ROUNDS=${ROUNDS:-3} T=${T:-5} QD=${QD:-32} BS=${BS:-4096}
trid='trtype:soft backend:null size:1GiB'
cargo build --release --locked -q -p pollux-capi -p pollux-cli
engine=$(crates/capi/fio/build.sh release | tail -1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$ROUNDS"); do
    # fio's main thread (which connects, so starts the device thread) on
    # core 1, its job thread on core 0: as perf places its device and worker.
    POLLUX_FIO_CPU=1 taskset -c 1 fio --thread=1 --ioengine=external:"$engine" \
        --filename="${trid//:/\\:}" --name=fio --rw=randread --bs="$BS" \
        --iodepth="$QD" --time_based --runtime="$T" --cpus_allowed=0 \
        ${FIO_OPTS:-} --output-format=json --output="$out/fio$r.json" 2>"$out/fio$r.err"
    target/release/pollux perf -r "$trid" -q "$QD" -o "$BS" -w randread -t "$T" \
        -c 0 --json >"$out/perf$r.json" 2>/dev/null
    echo "round $r done" >&2
done
python3 - "$out" "$ROUNDS" "$QD" "$BS" "$T" <<'PY'
import json, re, statistics, sys
d, rounds, qd, bs, t = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
fio, perf, ratio, fcpu, pcpu = [], [], [], [], []
for r in range(1, rounds + 1):
    j = json.load(open(f"{d}/fio{r}.json"))["jobs"][0]
    assert j["error"] == 0, f"fio round {r}: error {j['error']}"
    m = re.search(r"cpu_s ([0-9.]+) ios (\d+)", open(f"{d}/fio{r}.err").read())
    p = json.load(open(f"{d}/perf{r}.json"))
    fi, pi = j["read"]["iops"], p["total"]["iops"]
    fio.append(fi); perf.append(pi); ratio.append(fi / pi)
    fcpu.append(float(m.group(1)) / int(m.group(2)) * 1e9)
    pcpu.append(sum(c["cpu_s"] for c in p["cores"]) / p["total"]["ios"] * 1e9)
    print(f"round {r}: fio {fi:,.0f} IOPS ({fcpu[-1]:.0f} ns CPU/I/O), "
          f"perf {pi:,.0f} IOPS ({pcpu[-1]:.0f} ns CPU/I/O), fio/perf {ratio[-1]:.3f}")
def s(name, v, f):
    print(f"{name}: median {f(statistics.median(v))}, range {f(min(v))} .. {f(max(v))}")
print(f"-- {rounds} rounds, randread {bs} B, QD {qd}, {t} s each, emulated null controller")
s("fio + pollux IOPS", fio, lambda x: f"{x:,.0f}")
s("pollux perf IOPS", perf, lambda x: f"{x:,.0f}")
s("fio/perf IOPS ratio", ratio, lambda x: f"{x:.3f}")
s("fio job thread CPU ns per I/O", fcpu, lambda x: f"{x:.0f}")
s("perf worker CPU ns per I/O", pcpu, lambda x: f"{x:.0f}")
s("fio extra CPU ns per I/O (median of each)", [statistics.median(fcpu) - statistics.median(pcpu)], lambda x: f"{x:.0f}")
PY
