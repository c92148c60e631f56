# pollux guest suite: runs INSIDE the guest (busybox sh), started by
# run-tests.sh, which ships /opt/pollux (the CLI) and /opt/pcie-test (the
# driver's tests/pcie.rs test binary). Prints one `RESULT <name> ok|FAIL`
# line per check and `METRIC <name> <value>` lines; run-tests.sh sums them.
#
# Disk layout (1 GiB namespace, 512 B LBAs): pcie-test uses the first 32 MiB
# and the middle/three-quarter marks; the kernel -> pollux handoff lives at
# 600 MiB, pollux -> kernel at 700 MiB; perf --verify writes anywhere, so it
# runs after the kernel's data was checked and before pollux writes its own.
set -u
export PATH=/opt:$PATH
P=/opt/pollux
T=/opt/pcie-test
PERF_T=${PERF_T:-4}
PERF_DB_T=${PERF_DB_T:-2}

BDF=
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = 0x010802 ] && BDF=${d##*/}; done
DEV=/sys/bus/pci/devices/$BDF
export POLLUX_PCIE_BDF=$BDF POLLUX_PCIE_SERIAL=guestnvme0
TRID="trtype:pcie traddr:$BDF"

result() { echo "RESULT $1 $2"; }
check() {  # check NAME CMD...: runs CMD, output indented
    name=$1; shift
    echo "== $name: $*"
    if "$@" > /tmp/out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/out | tail -n 40
    if [ $rc = 0 ]; then result "$name" ok; else result "$name" FAIL; fi
    return $rc
}
listed() {  # listed PATTERN: `pollux setup list` shows it
    $P setup list > /tmp/list; rc=$?; cat /tmp/list
    [ $rc = 0 ] && grep -q "$1" /tmp/list
}
expect_fail() {  # expect_fail NAME PATTERN CMD...: CMD must fail and print PATTERN
    name=$1; pat=$2; shift 2
    echo "== $name: $* (must fail with '$pat')"
    if "$@" > /tmp/out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/out
    if [ $rc != 0 ] && grep -q "$pat" /tmp/out; then result "$name" ok; else result "$name" FAIL; fi
}
wait_blk() {
    for i in $(seq 100); do [ -b /dev/nvme0n1 ] && return 0; sleep 0.1; done
    echo "no /dev/nvme0n1"; return 1
}
NR_USER=pollux   # the unprivileged user (no adduser in busybox: /etc/passwd line)
as_user() {  # as_user CMD ARGS...: CMD as $NR_USER (su from root: no password, rlimits inherited)
    cmd=exec
    for a in "$@"; do cmd="$cmd '$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'"; done
    su -s /bin/sh $NR_USER -c "$cmd"
}
json_total_iops() { sed -n 's/.*"total":{[^}]*"iops":\([0-9.]*\).*/\1/p' "$1" | cut -d. -f1; }
AS=     # perf() runs pollux through this command when set (as_user)
perf() {  # perf NAME ARGS...: prints IOPS as METRIC NAME
    name=$1; shift
    echo "== perf $name: ${AS:+$AS }pollux perf -r '$TRID' $*"
    if $AS $P perf -r "$TRID" --json "$@" > /tmp/perf.json 2>/tmp/perf.err; then
        iops=$(json_total_iops /tmp/perf.json)
        errs=$(sed -n 's/.*"total":{[^}]*"errors":\([0-9]*\).*/\1/p' /tmp/perf.json)
        sq=$(sed -n 's/.*"sq_doorbells_per_io":\([0-9.e-]*\).*/\1/p' /tmp/perf.json)
        echo "   IOPS $iops, errors $errs, SQ doorbells/IO $sq"
        echo "METRIC $name $iops"
        [ "${errs:-1}" = 0 ] && result "perf-$name" ok || result "perf-$name" FAIL
    else
        cat /tmp/perf.err /tmp/perf.json | sed 's/^/   /'
        result "perf-$name" FAIL
    fi
}
perf_lat() {  # perf_lat NAME ARGS...: IOPS, p50/p99/max latency (us), worker CPU as METRICs
    name=$1; shift
    echo "== perf $name: ${AS:+$AS }pollux perf -r '$TRID' $*"
    if $AS $P perf -r "$TRID" --json -L "$@" > /tmp/perf.json 2>/tmp/perf.err; then
        iops=$(json_total_iops /tmp/perf.json)
        errs=$(sed -n 's/.*"total":{[^}]*"errors":\([0-9]*\).*/\1/p' /tmp/perf.json)
        for k in p50_lat_us p99_lat_us max_lat_us worker_cpu_util_max; do
            v=$(sed -n "s/.*\"total\":{.*\"$k\":\([0-9.e+-]*\).*/\1/p" /tmp/perf.json)
            echo "METRIC $name-$k ${v:-nan}"
        done
        echo "   IOPS $iops, errors $errs"
        echo "METRIC $name $iops"
        [ "${errs:-1}" = 0 ] && result "perf-$name" ok || result "perf-$name" FAIL
    else
        cat /tmp/perf.err /tmp/perf.json | sed 's/^/   /'
        result "perf-$name" FAIL
    fi
}
bdevperf() {  # bdevperf NAME ARGS...: pollux bdevperf, IOPS as METRIC NAME, ok iff no I/O failed
    name=$1; shift
    echo "== bdevperf $name: pollux bdevperf $*"
    # (-r: its own JSON-RPC socket; a target may hold the default.)
    if $P bdevperf -r /tmp/bdevperf.sock --json "$@" > /tmp/bp.json 2>/tmp/bp.err; then
        iops=$(json_total_iops /tmp/bp.json)
        errs=$(sed -n 's/.*"total":{[^}]*"errors":\([0-9]*\).*/\1/p' /tmp/bp.json)
        echo "   IOPS $iops, errors $errs"
        echo "METRIC $name $iops"
        [ "${errs:-1}" = 0 ] && result "bdevperf-$name" ok || result "bdevperf-$name" FAIL
    else
        tail -5 /tmp/bp.err | sed 's/^/   /'; head -c 600 /tmp/bp.json | sed 's/^/   /'; echo
        result "bdevperf-$name" FAIL
    fi
}
fio_iops() {  # fio_iops NAME EXTRA...: 4k randread QD32 on /dev/nvme0n1
    name=$1; shift
    echo "== fio $name: $*"
    if fio --name=$name --filename=/dev/nvme0n1 --direct=1 --rw=randread --bs=4k \
        --iodepth=32 --runtime=$PERF_T --time_based --eta=never --minimal "$@" > /tmp/fio.out 2>&1; then
        iops=$(awk -F';' '{print $8}' /tmp/fio.out | tail -1)
        echo "   IOPS $iops"
        echo "METRIC $name $iops"
        result "fio-$name" ok
    else
        sed 's/^/   /' /tmp/fio.out; result "fio-$name" FAIL
    fi
}

held_perf() {  # held_perf vfio|uio: `pollux perf` is refused while another process holds the device
    rm -f /tmp/hold
    POLLUX_HOLD=/tmp/hold $T --exact hold_device --nocapture --test-threads=1 > /tmp/hold.out 2>&1 &
    holder=$!
    for i in $(seq 1200); do [ -e /tmp/hold ] && break; sleep 0.1; done
    if [ $1 = uio ]; then pat="is in use: process $holder "; else pat="the device is in use"; fi
    expect_fail $1-perf-while-held "$pat" $P perf -r "$TRID" -t 1
    rm -f /tmp/hold; wait $holder
    check $1-perf-after-holder $P perf -r "$TRID" -t 1
}
mixed_bdevperf() {  # mixed_bdevperf vfio|uio: this PCIe controller and an NVMe/TCP one in one bdevperf
    MNQN=nqn.2026-11.dev.pollux:guest-mixed
    $P target -r /tmp/mixed-target.sock --listen 127.0.0.1:4432 --ram 64MiB --nqn $MNQN -m 0x1 > /tmp/mixed-target.log 2>&1 &
    mpid=$!
    for i in $(seq 200); do grep -q listening /tmp/mixed-target.log 2>/dev/null && break; sleep 0.1; done
    bdevperf $1-tcp-mixed-verify --nvme "$TRID" \
        --nvme "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4432 subnqn:$MNQN" \
        -w randrw -M 50 -q 8 -o 4096 -t 2 --verify -m 0x2
    # Both bdevs ran: the PCIe controller's and the TCP one's.
    check $1-tcp-mixed-both-bdevs sh -c 'grep -q "\"name\":\"Nvme0n1\"" /tmp/bp.json && grep -q "\"name\":\"Nvme1n1\"" /tmp/bp.json'
    kill -TERM $mpid 2>/dev/null; wait $mpid 2>/dev/null
}

echo "controller $BDF, $(nproc) vCPUs, kernel $(uname -r), cmdline: $(cat /proc/cmdline)"
check setup-hugepages $P setup hugepages 64

# --- kernel driver: refusals, data for pollux, fio baseline ------------------------
modprobe nvme poll_queues=2
wait_blk
check setup-list-nvme listed "$BDF.* nvme .*nvme0n1"
expect_fail open-needs-bind "pollux setup bind $BDF" $P perf -r "$TRID" -t 1
printf 'n\np\n1\n\n+64M\nw\n' | fdisk /dev/nvme0n1 > /dev/null 2>&1
for i in $(seq 50); do [ -b /dev/nvme0n1p1 ] && break; sleep 0.1; done
mke2fs /dev/nvme0n1p1 > /dev/null 2>&1 && mkdir -p /mnt/data && mount -t ext2 /dev/nvme0n1p1 /mnt/data
expect_fail setup-refuses-mounted "nvme0n1p1 is mounted on /mnt/data" $P setup bind $BDF
umount /mnt/data
# Mounted in another mount namespace only (a container's): not in our
# /proc/mounts; the kernel's exclusive claim (O_EXCL open: EBUSY) shows it.
rm -f /tmp/nsmnt
unshare -m sh -c 'mount -t ext2 /dev/nvme0n1p1 /mnt/data && echo ok > /tmp/nsmnt && exec sleep 600' &
NSPID=$!
for i in $(seq 50); do [ -s /tmp/nsmnt ] && break; sleep 0.1; done
if [ -s /tmp/nsmnt ] && ! grep -q nvme0n1p1 /proc/mounts; then
    expect_fail setup-refuses-mounted-elsewhere "/dev/nvme0n1p1 is busy" $P setup bind $BDF
else
    echo "   could not mount nvme0n1p1 in a mount namespace of its own"; result setup-refuses-mounted-elsewhere FAIL
fi
kill $NSPID; wait $NSPID 2>/dev/null
mkswap /dev/nvme0n1p1 > /dev/null && swapon /dev/nvme0n1p1
expect_fail setup-refuses-swap "nvme0n1p1 is in use as swap" $P setup bind $BDF
swapoff /dev/nvme0n1p1
# A process holding the partition or the controller's char device open.
hold() {  # hold DEV: a background sleep with DEV open as stdin, its PID in SPID
    sleep 600 < $1 & SPID=$!
    for i in $(seq 50); do [ "$(readlink /proc/$SPID/fd/0)" = $1 ] && return 0; sleep 0.1; done
}
hold /dev/nvme0n1p1
expect_fail setup-refuses-open-partition "/dev/nvme0n1p1 is open in process $SPID" $P setup bind $BDF
kill $SPID; wait $SPID 2>/dev/null
hold /dev/nvme0
expect_fail setup-refuses-open-ctrl "/dev/nvme0 is open in process $SPID" $P setup bind $BDF
kill $SPID; wait $SPID 2>/dev/null
# Content the kernel would use without a mount line: a ZFS label (uberblock
# magics in L0's ring) and a btrfs superblock of a 2-device file system.
poke() {  # poke OFFSET BYTES(printf octal): write into nvme0n1p1
    printf "$2" | dd of=/dev/nvme0n1p1 bs=1 seek=$1 conv=notrunc 2>/dev/null
}
dd if=/dev/zero of=/dev/nvme0n1p1 bs=1024 seek=64 count=192 conv=notrunc 2>/dev/null
for slot in 4 5 6 7; do poke $(((128 + slot) * 1024)) '\014\261\272'; done
# (the partition only: through the whole disk its labels are the partition's)
expect_fail setup-refuses-zfs "kernel: /dev/nvme0n1p1 is a ZFS vdev" $P setup bind $BDF
dd if=/dev/zero of=/dev/nvme0n1p1 bs=1024 seek=64 count=192 conv=notrunc 2>/dev/null
poke $((65536 + 64)) '_BHRfS_M'; poke $((65536 + 136)) '\002'
expect_fail setup-refuses-btrfs "/dev/nvme0n1p1 is one of 2 devices of btrfs" $P setup bind $BDF
dd if=/dev/zero of=/dev/nvme0n1p1 bs=1024 seek=64 count=192 conv=notrunc 2>/dev/null
check setup-list-free listed "$BDF.* nvme .*free"

dd if=/dev/urandom of=/tmp/k.bin bs=64k count=16 2>/dev/null
check kernel-writes dd if=/tmp/k.bin of=/dev/nvme0n1 bs=64k seek=9600 conv=fsync   # 600 MiB = LBA 1228800
# pollux's io_uring bdev on the kernel's block device: data verified on the
# scratch partition (zeroed first: --verify accepts zeros or its own tags,
# and the refusal tests above left file system and swap signatures), then
# IOPS beside fio's io_uring engine (reads only).
check wipe-partition dd if=/dev/zero of=/dev/nvme0n1p1 bs=1M count=64 conv=fsync
bdevperf uring-verify --uring /dev/nvme0n1p1 -w randrw -M 50 -q 32 -o 4096 -t 2 --verify
bdevperf uring-verify-64k --uring /dev/nvme0n1p1 -w verify -q 8 -o 65536 -t 2
# IOPOLL needs the driver's poll queues (modprobe nvme poll_queues=2 above).
bdevperf uring-iopoll-verify --uring /dev/nvme0n1p1 --iopoll -w randrw -M 50 -q 32 -o 4096 -t 2 --verify
for round in 1 2; do
    bdevperf bdevperf-uring --uring /dev/nvme0n1 -w randread -q 32 -o 4096 -t $PERF_T
    fio_iops fio-io_uring --ioengine=io_uring
    if [ "$(cat /sys/module/nvme/parameters/poll_queues 2>/dev/null)" -gt 0 ] 2>/dev/null; then
        bdevperf bdevperf-uring-iopoll --uring /dev/nvme0n1 --iopoll -w randread -q 32 -o 4096 -t $PERF_T
        fio_iops fio-io_uring-polled --ioengine=io_uring --hipri=1
    else
        echo "nvme.poll_queues not available: no polled fio run"
    fi
done

# --- vfio-pci -----------------------------------------------------------------------
check setup-bind-vfio $P setup bind $BDF
check setup-list-vfio listed "$BDF.* vfio-pci .*user space"
check handoff-kernel-to-pollux-vfio env POLLUX_HANDOFF=verify:/tmp/k.bin:1228800 $T --exact kernel_handoff --nocapture --test-threads=1
check pcie-tests-vfio $T --test-threads=1
held_perf vfio
check wipe-vfio env POLLUX_WIPE=1 $T --exact wipe_namespace --nocapture
perf vfio-verify -w randrw -M 50 -q 32 -o 4096 -t 3 --verify
perf vfio-verify-sizes -w randrw -M 50 -q 8 -o 1m -t 2 --verify
bdevperf vfio-bdevperf-verify --nvme "$TRID" -w randrw -M 50 -q 32 -o 4096 -t 3 --verify
mixed_bdevperf vfio
. /opt/target-nvme.sh   # pollux target serving this controller's namespace over TCP
# Without root: an ordinary user (uid 1000, no capabilities) needs only
# read/write access to /dev/vfio/vfio (0666) and the group node (root 0600
# by default), and a locked-memory limit covering the pinned DMA memory.
GNODE=/dev/vfio/$(basename "$(readlink $DEV/iommu_group)")
grep -q "^$NR_USER:" /etc/passwd || {
    echo "$NR_USER:x:1000:1000:pollux:/tmp:/bin/sh" >> /etc/passwd
    echo "$NR_USER:x:1000:" >> /etc/group
}
NR_PERF="-w randrw -q 8 -t 2 --verify"
(
    ulimit -l 65536   # KiB; root raises it, su keeps it
    check vfio-nonroot-user as_user sh -c 'echo "$(id), $(grep CapEff /proc/self/status | tr -d "\t"), ulimit -l $(ulimit -l)"
        [ "$(id -u)" != 0 ] && grep -q "^CapEff:[[:space:]]*0*$" /proc/self/status'
    ls -l /dev/vfio | sed 's/^/   /'
    expect_fail vfio-nonroot-no-group-access "$GNODE: Permission denied" as_user $P perf -r "$TRID" $NR_PERF
    chown $NR_USER $GNODE
    AS=as_user
    perf vfio-nonroot-verify $NR_PERF
    ulimit -l 4       # one page: the first buffer is mlock'ed, then its VFIO pinning fails
    expect_fail vfio-nonroot-low-memlock "RLIMIT_MEMLOCK.*ulimit -l" as_user $P perf -r "$TRID" $NR_PERF
)
chown 0:0 $GNODE
# Doorbell variants, interleaved in short rounds (run-tests.sh takes the
# median): host load drifts during a run and TCG follows it.
# PERF_DB_ROUNDS rounds (default 2: the suite's time goes to checks).
for round in $(seq ${PERF_DB_ROUNDS:-2}); do
    perf vfio-shadow-delayed -w randread -q 32 -o 4096 -t $PERF_DB_T
    perf vfio-shadow-perio -w randread -q 32 -o 4096 -t $PERF_DB_T --no-delayed-doorbell
    perf vfio-mmio-delayed -w randread -q 32 -o 4096 -t $PERF_DB_T --no-shadow-doorbell
    perf vfio-mmio-perio -w randread -q 32 -o 4096 -t $PERF_DB_T --no-shadow-doorbell --no-delayed-doorbell
    perf vfio-shadow-delayed-cqline -w randread -q 32 -o 4096 -t $PERF_DB_T --cq-line-batch
    bdevperf vfio-bdevperf --nvme "$TRID" -w randread -q 32 -o 4096 -t $PERF_DB_T
done
dd if=/dev/urandom of=/tmp/p.bin bs=64k count=16 2>/dev/null
check pollux-writes-vfio env POLLUX_HANDOFF=write:/tmp/p.bin:1433600 $T --exact kernel_handoff --nocapture --test-threads=1

# --- back to the kernel: pollux's data must be there ----------------------------------
check setup-reset-nvme $P setup reset $BDF
wait_blk
check handoff-pollux-to-kernel sh -c "dd if=/dev/nvme0n1 bs=64k skip=11200 count=16 2>/dev/null | cmp - /tmp/p.bin"

# --- uio_pci_generic (the guest runs with iommu=pt) --------------------------------------
check setup-bind-uio $P setup bind --driver uio_pci_generic $BDF
check handoff-kernel-to-pollux-uio env POLLUX_HANDOFF=verify:/tmp/p.bin:1433600 $T --exact kernel_handoff --nocapture --test-threads=1
check pcie-tests-uio $T --test-threads=1
held_perf uio
$P setup hugepages 0 > /dev/null
expect_fail uio-without-hugepages ".pollux setup hugepages" $P perf -r "$TRID" -t 1
$P setup hugepages 64 > /dev/null
check wipe-uio env POLLUX_WIPE=1 $T --exact wipe_namespace --nocapture
perf uio-verify -w randrw -M 50 -q 32 -o 4096 -t 3 --verify
mixed_bdevperf uio
# INTx through uio: data must be right. Not timed: QEMU 7.2 keeps the
# INTx line asserted (tens of thousands of interrupts per I/O show in
# /proc/interrupts), so a latency figure would measure the storm.
irq_before=$(awk '/uio_pci_generic/ {print $2}' /proc/interrupts)
perf uio-irq-verify -w randrw -M 50 -q 8 -o 4096 -t 2 --verify --interrupts
echo "   INTx interrupts during that run: $(( $(awk '/uio_pci_generic/ {print $2}' /proc/interrupts) - ${irq_before:-0} ))"
perf uio-shadow-delayed -w randread -q 32 -o 4096 -t $PERF_T
perf uio-shadow-delayed -w randread -q 32 -o 4096 -t $PERF_T
# --- vfio-pci again: interrupts (MSI-X through VFIO eventfds) -----------
# Last, after the INTx checks under uio: QEMU 7.2's pin-interrupt
# bookkeeping (cq_pending) is decremented by every CQ head doorbell that
# finds a queue empty but incremented only when an empty queue gets an
# entry, and a controller reset does not clear it: interrupt-mode runs
# (which release the CQ head before sleeping) left INTx stuck or storming
# for the uio checks that followed them (seen in 3 of 6 guest runs).
check setup-bind-vfio-irq $P setup bind $BDF
perf vfio-irq-verify -w randrw -M 50 -q 8 -o 4096 -t 2 --verify --interrupts
# QD 1, polled vs interrupts, interleaved.
for i in 1 2 3; do
    perf_lat vfio-qd1-polled -w randread -q 1 -o 4096 -t $PERF_DB_T
    perf_lat vfio-qd1-irq -w randread -q 1 -o 4096 -t $PERF_DB_T --interrupts
done
check setup-reset-all $P setup reset
check setup-list-final listed "$BDF.* nvme "
# --- NVMe/TCP ------------------------------------------------------------
. /opt/tcp.sh      # pollux host -> Linux nvmet-tcp
. /opt/target.sh   # Linux's host (nvme-tcp) -> pollux target
. /opt/ns-live.sh  # namespaces added and removed live over JSON-RPC, Linux rescans
ns_live_checks
# --- Multipath: Linux native multipath over two pollux targets ----------
. /opt/multipath.sh; multipath_checks
# --- In-band authentication (DH-HMAC-CHAP), 6.12 kernel only -----------
. /opt/auth-host.sh     # pollux host -> Linux nvmet with DH-HMAC-CHAP
. /opt/auth-target.sh   # Linux's host -> pollux target, with authentication
