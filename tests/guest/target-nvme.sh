# `pollux target` serving an NVMe namespace through the driver (vfio-pci:
# QEMU's controller behind the emulated IOMMU), in the guest. Sourced by
# suite.sh while the controller is bound to vfio-pci (uses its check and
# result helpers, $P and $TRID).
#
# pollux's own host writes and verifies data through it over TCP (4 KiB
# and 128 KiB, the latter with digests), then Linux's nvme-tcp host
# connects and fio verifies 4 KiB and 128 KiB writes through the block
# device it creates. Data crosses the target's DMA staging of the
# namespace (many commands in flight per queue) and the real device.
VNQN=nqn.2026-11.dev.pollux:guest-target-nvme
VPORT=4431
modprobe crc32c_generic 2>/dev/null
modprobe nvme-tcp

$P target -r /tmp/target-nvme.sock --listen 127.0.0.1:$VPORT --nvme "$TRID" --nqn $VNQN -m 0x1 > /tmp/target-nvme.log 2>&1 &
VPID=$!
vtarget_up() {
    for i in $(seq 200); do
        grep -q "listening" /tmp/target-nvme.log 2>/dev/null && return 0
        kill -0 $VPID 2>/dev/null || { echo "target exited:"; cat /tmp/target-nvme.log; return 1; }
        sleep 0.1
    done
    echo "target not listening after 20 s"; cat /tmp/target-nvme.log; return 1
}
if check target-nvme-start vtarget_up; then
    VTRID="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$VPORT subnqn:$VNQN"
    check target-nvme-pollux-verify $P perf -r "$VTRID" -w randrw -M 50 -q 32 -o 4096 -t 3 --verify -c 1
    check target-nvme-pollux-verify-128k-digests $P perf -r "$VTRID hdgst:1 ddgst:1" -w randrw -M 50 -q 8 -o 128k -t 2 --verify -c 1
    if check target-nvme-connect nvme connect -t tcp -a 127.0.0.1 -s $VPORT -n $VNQN; then
        VD=
        for i in $(seq 100); do
            for c in /sys/class/nvme/nvme*; do
                [ "$(cat $c/subsysnqn 2>/dev/null)" = "$VNQN" ] || continue
                for b in $c/nvme*n1 /sys/block/${c##*/}n1; do
                    [ -e "$b" ] && [ -b /dev/${b##*/} ] && VD=/dev/${b##*/}
                done
            done
            [ -n "$VD" ] && break
            sleep 0.1
        done
        if [ -n "$VD" ]; then
            echo "   block device $VD"
            for bs in 4k 128k; do
                check target-nvme-fio-$bs sh -c "fio --name=verify --filename=$VD --ioengine=libaio --direct=1 \
                    --rw=randwrite --bs=$bs --size=32M --iodepth=16 --verify=crc32c --verify_fatal=1 \
                    --do_verify=1 --output-format=terse --minimal > /tmp/fio.out 2>&1 || { cat /tmp/fio.out; exit 1; }"
            done
            # fio's blocks would be foreign data to the perf --verify runs
            # that follow on this namespace: zeroed again, through the target.
            check target-nvme-zero dd if=/dev/zero of=$VD bs=1M count=32 oflag=direct
        else
            result target-nvme-blockdev FAIL
        fi
        check target-nvme-disconnect nvme disconnect -n $VNQN
    fi
fi
kill -TERM $VPID 2>/dev/null
check target-nvme-stop sh -c "for i in \$(seq 100); do kill -0 $VPID 2>/dev/null || exit 0; sleep 0.1; done; exit 1"
sed 's/^/   target: /' /tmp/target-nvme.log | tail -n 10
