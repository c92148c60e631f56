#!/bin/bash
# pollux against QEMU's NVMe controller, in a guest: builds the pollux CLI
# and the driver's PCIe test binary (static, glibc), boots one guest
# (tests/guest/run.sh) and runs suite.sh in it: vfio-pci and
# uio_pci_generic bindings, driver tests, `pollux setup`, data handoff to
# and from the kernel nvme driver, `pollux perf --verify`, delayed vs
# per-command SQ doorbell, kernel fio (io_uring, polled) for comparison.
#
# Prints each check, the measured ratios, and a closing
# 'N passed, N failed' line; exits non-zero if anything failed.
#
# Env: CARGO_TARGET_DIR (default: <repo>/target), PERF_T (seconds per perf
# and fio run, default 4), PERF_DB_T (seconds per doorbell-variant run,
# default 2; PERF_DB_ROUNDS rounds, default 2), GUEST_TIMEOUT (default 900 s), KSUITE (default
# bookworm-backports: Debian's 6.12 kernel, which has NVMe in-band
# authentication; KSUITE= takes Debian 12's own 6.1), and run.sh's
# GUEST_CACHE / GUEST_CPUS / GUEST_MEM.
set -euo pipefail
export KSUITE=${KSUITE-bookworm-backports}

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TRIPLE=x86_64-unknown-linux-gnu
start=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# Static glibc binaries: the guest has glibc 2.36 and few libraries.
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
export CARGO_TARGET_DIR=$TARGET_DIR
echo "run-tests.sh: building pollux and the PCIe test binary (static, $TRIPLE)" >&2
# One cargo run, profile `guest` (release, unwinding): pollux and the test
# binaries share their dependencies' builds.
BUILT=$(cd "$ROOT" && cargo build --profile guest -q --target $TRIPLE \
    -p pollux-cli -p pollux-pcie -p pollux-tcp --bin pollux --test pcie --test peer \
    --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/')
TEST_BIN=$(grep '/pcie-' <<<"$BUILT" | tail -1)
PEER_BIN=$(grep '/peer-' <<<"$BUILT" | tail -1)
POLLUX_BIN=$TARGET_DIR/$TRIPLE/guest/pollux
[[ -x $POLLUX_BIN && -x $TEST_BIN && -x $PEER_BIN ]] || { echo "run-tests.sh: build did not produce the binaries" >&2; exit 2; }
build_s=$((SECONDS - start))

LOG=$(mktemp /tmp/pollux-guest-tests.XXXXXX)
trap 'rm -f "$LOG"' EXIT
rc=0
# iommu=pt: uio_pci_generic needs untranslated DMA (physical addresses);
# vfio-pci still gets its own translated IOMMU domain.
GUEST_APPEND="iommu=pt ${GUEST_APPEND:-}" "$HERE/run.sh" --timeout "${GUEST_TIMEOUT:-900}" \
    --extra-file "$POLLUX_BIN:/opt/pollux" --extra-file "$TEST_BIN:/opt/pcie-test" \
    --extra-file "$PEER_BIN:/opt/tcp-peer-test" \
    --extra-file "$HERE/tcp.sh:/opt/tcp.sh" --extra-file "$HERE/target.sh:/opt/target.sh" \
    --extra-file "$HERE/target-nvme.sh:/opt/target-nvme.sh" --extra-file "$HERE/ns-live.sh:/opt/ns-live.sh" \
    --extra-file "$HERE/auth-host.sh:/opt/auth-host.sh" --extra-file "$HERE/auth-target.sh:/opt/auth-target.sh" \
    --extra-file "$HERE/multipath.sh:/opt/multipath.sh" \
    -- "PERF_T=${PERF_T:-4}; PERF_DB_T=${PERF_DB_T:-2}; PERF_DB_ROUNDS=${PERF_DB_ROUNDS:-2}; $(cat "$HERE/suite.sh")" 2>&1 | tee "$LOG" || rc=$?
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# Median of a metric's values (runs are repeated, interleaved).
metric() {
    awk -v n="$1" '$1=="METRIC" && $2==n {print $3}' "$LOG" | sort -n |
        awk '{v[NR] = $1} END {if (NR) printf "%d", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
metricf() {  # metricf NAME: median of a fractional metric, 3 significant digits
    awk -v n="$1" '$1=="METRIC" && $2==n && $3!="nan" {print $3}' "$LOG" | sort -g |
        awk '{v[NR] = $1} END {if (NR) printf "%.3g", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() {  # ratio A B: A/B with 2 decimals, or n/a
    local a b; a=$(metric "$1"); b=$(metric "$2")
    if [[ -n $a && -n $b && $b != 0 ]]; then awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", a / b}'; else echo n/a; fi
}
echo
echo "===== ratios of median IOPS (4 KiB randread QD32, 1 queue pair / 1 fio job) ====="
echo "TCG emulation: compare ratios, not absolute IOPS; they follow host load (load average before: $load_before, after: $load_after)"
printf '%-62s %s\n' \
    "delayed / per-command SQ doorbell, MMIO doorbells (vfio):" "$(ratio vfio-mmio-delayed vfio-mmio-perio)" \
    "delayed / per-command SQ doorbell, shadow doorbells (vfio):" "$(ratio vfio-shadow-delayed vfio-shadow-perio)" \
    "shadow / MMIO doorbells, delayed (vfio):" "$(ratio vfio-shadow-delayed vfio-mmio-delayed)" \
    "CQ line batch on / off, shadow, delayed (vfio):" "$(ratio vfio-shadow-delayed-cqline vfio-shadow-delayed)" \
    "bdevperf over NVMe / perf, shadow, delayed (vfio):" "$(ratio vfio-bdevperf vfio-shadow-delayed)" \
    "pollux io_uring bdev / kernel fio io_uring (kernel nvme0n1):" "$(ratio bdevperf-uring fio-io_uring)" \
    "pollux io_uring bdev, IOPOLL / fio io_uring hipri (nvme0n1):" "$(ratio bdevperf-uring-iopoll fio-io_uring-polled)" \
    "pollux vfio / kernel fio io_uring:" "$(ratio vfio-shadow-delayed fio-io_uring)" \
    "pollux vfio / kernel fio io_uring polled (hipri):" "$(ratio vfio-shadow-delayed fio-io_uring-polled)" \
    "pollux uio / kernel fio io_uring:" "$(ratio uio-shadow-delayed fio-io_uring)" \
    "pollux uio / kernel fio io_uring polled (hipri):" "$(ratio uio-shadow-delayed fio-io_uring-polled)"
echo
echo "===== QD 1, 4 KiB randread: polled vs interrupts (medians; TCG emulation: ratios, not speeds) ====="
printf '%-34s %10s %10s %10s %10s %8s\n' "" "IOPS" "p50 us" "p99 us" "max us" "CPU"
for m in vfio-qd1-polled vfio-qd1-irq; do
    printf '%-34s %10s %10s %10s %10s %8s\n' "$m" "$(metric $m)" "$(metricf $m-p50_lat_us)" \
        "$(metricf $m-p99_lat_us)" "$(metricf $m-max_lat_us)" "$(metricf $m-worker_cpu_util_max)"
done
printf '%-62s %s\n' \
    "IOPS interrupts / polled (vfio, MSI-X):" "$(ratio vfio-qd1-irq vfio-qd1-polled)"
echo "IOPS (each run): $(awk '$1=="METRIC" {printf "%s=%s ", $2, $3}' "$LOG")"

# (-o, unanchored: a RESULT printed after output without a final newline
# still counts)
passed=$({ grep -o 'RESULT [^ ]* ok$' "$LOG" || true; } | wc -l)
failed=$({ grep -o 'RESULT [^ ]* FAIL$' "$LOG" || true; } | wc -l)
if ((rc != 0 && failed == 0)); then failed=1; echo "guest run failed (exit status $rc)"; fi
grep -o 'RESULT [^ ]* FAIL$' "$LOG" | sed 's/^RESULT /failed: /' || true
echo "guest suite: build ${build_s}s, total $((SECONDS - start))s"
echo "$passed passed, $failed failed"
((failed == 0))
