#!/bin/bash
# Boot a throwaway QEMU (TCG) guest with one emulated NVMe controller and run
# shell commands in it. Prints the commands' output between markers and exits
# with their exit status (124: timeout, 125: guest died without a status).
#
#   run.sh [--nvme-size SIZE] [--nvme-opts PROPS] [--extra-file HOSTPATH:GUESTPATH ...]
#          [--timeout SECONDS] [--console] [--qemu-arg ARG ...] -- 'commands'
#
# Env: GUEST_CACHE (default ~/.cache/pollux-guest), GUEST_CPUS (2), GUEST_MEM (2G),
#      GUEST_APPEND (extra kernel command line).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${GUEST_CACHE:-$HOME/.cache/pollux-guest${KSUITE:+-$KSUITE}}
NVME_SIZE=1G NVME_OPTS= TIMEOUT=600 CONSOLE=0
EXTRA=() QEMU_EXTRA=()

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0" >&2; exit 2; }
while (($#)); do
    case $1 in
        --nvme-size)  NVME_SIZE=$2; shift 2 ;;
        --nvme-opts)  NVME_OPTS=,$2; shift 2 ;;    # extra -device nvme properties, e.g. mdts=8
        --extra-file) EXTRA+=("$2"); shift 2 ;;
        --timeout)    TIMEOUT=$2; shift 2 ;;
        --console)    CONSOLE=1; shift ;;          # also print the kernel console log
        --qemu-arg)   QEMU_EXTRA+=("$2"); shift 2 ;;
        --)           shift; break ;;
        *)            usage ;;
    esac
done
(($#)) || usage

"$HERE/build.sh"    # installs missing host tools; no-op when the cached kernel/initramfs are up to date
command -v qemu-system-x86_64 >/dev/null || { echo "run.sh: apt-get install qemu-system-x86" >&2; exit 2; }

W=$(mktemp -d /tmp/guest-run.XXXXXX)
QPID=
cleanup() {
    if [[ -n $QPID ]] && kill -0 "$QPID" 2>/dev/null; then
        kill "$QPID" 2>/dev/null; sleep 1; kill -9 "$QPID" 2>/dev/null || true
    fi
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Per-run initramfs layer (the command script and extra files), appended to the
# cached base initramfs: the kernel unpacks concatenated cpio archives in order
# (each must start 4-byte aligned, hence the padding).
mkdir -p "$W/layer"
printf '%s\n' "$*" > "$W/layer/cmd.sh"
for spec in "${EXTRA[@]}"; do
    src=${spec%%:*} dst=${spec#*:}
    if [[ $spec != *:/* || ! -e $src ]]; then
        echo "run.sh: bad --extra-file '$spec' (want EXISTING_HOSTPATH:/abs/guest/path)" >&2; exit 2
    fi
    mkdir -p "$W/layer$(dirname "$dst")"
    cp -a "$src" "$W/layer$dst"
done
(cd "$W/layer" && find . | cpio -o -H newc -R 0:0 --quiet) > "$W/layer.cpio"
cp "$CACHE/initramfs.cpio" "$W/initrd"
truncate -s %4 "$W/initrd"
cat "$W/layer.cpio" >> "$W/initrd"

truncate -s "$NVME_SIZE" "$W/nvme.img"           # sparse raw image
: > "$W/console"; : > "$W/out"; : > "$W/status"

# ttyS0 = kernel console, ttyS1 = command output, ttyS2 = exit status (see init)
start=$SECONDS
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
    -nodefaults -no-user-config -machine q35 -accel tcg,thread=multi -cpu max \
    -smp "${GUEST_CPUS:-2}" -m "${GUEST_MEM:-2G}" \
    -device intel-iommu,caching-mode=on \
    -display none -vga none -nic none -monitor none -no-reboot \
    -kernel "$CACHE/vmlinux" -initrd "$W/initrd" \
    -append "console=ttyS0 intel_iommu=on no_timer_check panic=-1 ${GUEST_APPEND:-}" \
    -drive if=none,id=nvme0,file="$W/nvme.img",format=raw \
    -device nvme,serial=guestnvme0,drive=nvme0"$NVME_OPTS" \
    -serial file:"$W/console" -serial file:"$W/out" -serial file:"$W/status" \
    "${QEMU_EXTRA[@]}" </dev/null &
QPID=$!

echo "===== guest output begin ====="
tail -s 0.2 -n +1 -f --pid="$QPID" "$W/out" &
TPID=$!
qrc=0; wait "$QPID" || qrc=$?
wait "$TPID" || true
status=$(tr -dc 0-9 < "$W/status")
secs=$((SECONDS - start))

if [[ -n $status ]]; then
    rc=$status; why="exit status $rc"
elif ((qrc == 124 || qrc == 137)); then
    rc=124; why="TIMEOUT after ${TIMEOUT}s"
else
    rc=125; why="guest died without an exit status (qemu rc=$qrc)"
fi
echo "===== guest output end: $why, ${secs}s ====="
if ((CONSOLE)) || [[ -z $status ]]; then
    echo "===== kernel console (ttyS0)$( ((CONSOLE)) || echo ', last 40 lines') =====" >&2
    if ((CONSOLE)); then tr -d '\r' < "$W/console" >&2; else tr -d '\r' < "$W/console" | tail -n 40 >&2; fi
fi
exit "$rc"
