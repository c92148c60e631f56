# Linux's NVMe/TCP host (nvme-tcp, nvme-cli) against `pollux target`, in the
# guest. Sourced by suite.sh (uses its check/result helpers and $P).
#
# The target serves a RAM bdev on 127.0.0.1:4420 from one core; the kernel
# discovers it, connects (without and with header and data digests), and
# fio writes and verifies data through the block device it creates: 4 KiB
# writes travel in-capsule, 128 KiB writes through R2T + H2CData, reads
# come back as C2HData. Then the kernel disconnects and the target must
# still be running (and stop cleanly on SIGTERM).
TNQN=nqn.2026-11.dev.pollux:guest-target
TADDR=127.0.0.1
TPORT=4430   # tcp.sh's nvmet keeps 4420

# Digests need crc32c, which busybox modprobe does not pull in as a
# softdep of nvme-tcp: without it `nvme connect --hdr-digest` fails with a
# bare "No such file or directory".
modprobe crc32c_generic 2>/dev/null
modprobe crc32c-intel 2>/dev/null
modprobe nvme-tcp

$P target -r /tmp/target.sock --listen $TADDR:$TPORT --ram 256MiB --nqn $TNQN -m 0x1 > /tmp/target.log 2>&1 &
TPID=$!
target_up() {
    for i in $(seq 100); do
        nc -z $TADDR $TPORT 2>/dev/null && return 0
        grep -q "listening" /tmp/target.log 2>/dev/null && return 0
        kill -0 $TPID 2>/dev/null || { echo "target exited:"; cat /tmp/target.log; return 1; }
        sleep 0.1
    done
    echo "target not listening after 10 s"; cat /tmp/target.log; return 1
}
check target-start target_up

# pollux's own host against it first, while the namespace holds only
# zeros (perf --verify takes blocks it did not write for foreign data;
# fio's blocks come later): verified randrw, plain and with digests.
TTRID="trtype:tcp adrfam:ipv4 traddr:$TADDR trsvcid:$TPORT subnqn:$TNQN"
check target-pollux-host-verify $P perf -r "$TTRID" -w randrw -M 50 -q 16 -o 4096 -t 2 --verify -c 1
check target-pollux-host-verify-128k-digests $P perf -r "$TTRID hdgst:1 ddgst:1" -w randrw -M 50 -q 8 -o 128k -t 2 --verify -c 1

# The kernel's controller for $TNQN, once connected: /dev/<name>n1.
tdev() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$TNQN" ] || continue
        for i in $(seq 100); do
            for b in /sys/class/nvme/${c##*/}/nvme*n1 /sys/block/${c##*/}n1; do
                [ -e "$b" ] && { n=${b##*/}; [ -b /dev/$n ] && { echo /dev/$n; return 0; }; }
            done
            sleep 0.1
        done
    done
    return 1
}

# The kernel's controller for $TNQN: /dev/nvmeN.
tctrl() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$TNQN" ] && { echo /dev/${c##*/}; return 0; }
    done
    return 1
}

check target-discover sh -c "nvme discover -t tcp -a $TADDR -s $TPORT | tee /dev/stderr | grep -q 'subnqn: *$TNQN'"

# nvme-cli's admin commands through the kernel's controller $1 (/dev/nvmeN):
# Commands Supported and Effects (05h, 4 KiB, as `nvme get-log` asks), a
# log shorter than asked for (SMART, 512 bytes, read as 4 KiB: zeros past
# it, as Linux's nvmet sends), and Get Features of every feature an I/O
# controller must support. (`nvme effects-log` without --csi reads CAP
# through the PCI BAR to pick the command sets; a fabrics controller has
# none, so it exits 0 without asking the target anything: it "works"
# against any target. With --csi=0 it sends the Get Log Page.)
admin_cli() {
    C=$1
    nvme get-log $C --log-id=0x05 --log-len=4096 > /tmp/cel.out 2>&1 || { cat /tmp/cel.out; return 1; }
    head -n 3 /tmp/cel.out
    nvme effects-log $C > /tmp/cel.out 2>&1; echo "effects-log without --csi: rc $?, $(wc -l < /tmp/cel.out) lines"
    nvme effects-log $C --csi=0 > /tmp/cel.out 2>&1 || { cat /tmp/cel.out; return 1; }
    grep -qi "read" /tmp/cel.out || { echo "effects-log --csi=0 lists no Read:"; cat /tmp/cel.out; return 1; }
    nvme get-log $C --log-id=0x02 --log-len=4096 --raw-binary > /tmp/smart.bin || return 1
    n=$(($(wc -c < /tmp/smart.bin)))
    [ "$n" = 4096 ] || { echo "SMART read as 4 KiB: $n bytes"; return 1; }
    z=$(($(dd if=/tmp/smart.bin bs=512 skip=1 2>/dev/null | tr -d '\000' | wc -c)))
    [ "$z" = 0 ] || { echo "SMART read as 4 KiB: $z non-zero bytes past 512"; return 1; }
    for f in 0x01 0x02 0x04 0x06 0x07 0x0a 0x0b 0x0f; do
        nvme get-feature $C -f $f > /tmp/feat.out 2>&1 || { echo "get-feature $f:"; cat /tmp/feat.out; return 1; }
    done
    nvme get-feature $C -f 0x05 -n 1 > /tmp/feat.out 2>&1 || { echo "get-feature 0x05 -n 1:"; cat /tmp/feat.out; return 1; }
    echo "log pages 05h, 02h (4 KiB) and features 01h 02h 04h 05h 06h 07h 0Ah 0Bh 0Fh: ok"
}

fio_verify() {  # fio_verify DEV BS: random writes of BS verified by crc32c
    fio --name=verify --filename=$1 --ioengine=libaio --direct=1 --rw=randwrite --bs=$2 \
        --size=64M --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --output-format=terse --minimal > /tmp/fio.out 2>&1 || { cat /tmp/fio.out; return 1; }
    echo "fio $2 randwrite+verify: ok"
}

for digests in "" "--hdr-digest --data-digest"; do
    tag=plain; [ -n "$digests" ] && tag=digests
    if check target-connect-$tag nvme connect -t tcp -a $TADDR -s $TPORT -n $TNQN $digests; then
        if D=$(tdev); then
            echo "   block device $D"
            [ $tag = plain ] && check target-nvme-cli-admin admin_cli "$(tctrl)"
            check target-fio-4k-$tag fio_verify $D 4k
            check target-fio-128k-$tag fio_verify $D 128k
            check target-read-$tag sh -c "dd if=$D of=/dev/null bs=1M count=64 2>&1"
        else
            result target-blockdev-$tag FAIL
        fi
        check target-disconnect-$tag nvme disconnect -n $TNQN
    fi
done

# Configured live over JSON-RPC (`pollux rpc`, SPDK's methods) with
# Linux's host connected: a subsystem created live, listening on a new
# port and on the first subsystem's, is discovered and connected; removing
# its listener drops only its controller (the first subsystem's block
# device still reads), and it is deleted.
LNQN=nqn.2026-11.dev.pollux:guest-live
LPORT=4431
rpcq() { $P rpc -s /tmp/target.sock "$@"; }
laddr() { echo "{\"nqn\": \"$LNQN\", \"listen_address\": {\"trtype\": \"tcp\", \"adrfam\": \"ipv4\", \"traddr\": \"$TADDR\", \"trsvcid\": \"$1\"}}"; }
live_create() {
    rpcq nvmf_create_subsystem "{\"nqn\": \"$LNQN\", \"allow_any_host\": true}" &&
        rpcq nvmf_subsystem_add_listener "$(laddr $LPORT)" &&
        rpcq nvmf_subsystem_add_listener "$(laddr $TPORT)" &&
        rpcq nvmf_get_subsystems "{\"nqn\": \"$LNQN\"}"
}
lctrl() {  # Linux's controller of $LNQN: nvmeN
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$LNQN" ] && { echo ${c##*/}; return 0; }
    done
    return 1
}
live_dropped() {  # Linux's controller of $LNQN leaves state "live" (or goes)
    for i in $(seq 100); do
        c=$(lctrl) || { echo "controller gone"; return 0; }
        st=$(cat /sys/class/nvme/$c/state 2>/dev/null)
        [ "$st" != live ] && { echo "controller $c: $st"; return 0; }
        sleep 0.1
    done
    echo "controller $c still live"; return 1
}
first_reads() { D=$(tdev) && dd if=$D of=/dev/null bs=1M count=16 2>&1; }
live_gone() { ! rpcq nvmf_get_subsystems | grep -q "$LNQN"; }
if check target-live-create live_create; then
    check target-live-discover sh -c "nvme discover -t tcp -a $TADDR -s $TPORT | tee /dev/stderr | grep -q 'subnqn: *$LNQN'"
    check target-live-connect-first nvme connect -t tcp -a $TADDR -s $TPORT -n $TNQN
    check target-live-connect nvme connect -t tcp -a $TADDR -s $LPORT -n $LNQN
    check target-live-controllers sh -c "$P rpc -s /tmp/target.sock nvmf_subsystem_get_controllers '{\"nqn\": \"$LNQN\"}' | tee /dev/stderr | grep -q hostnqn"
    check target-live-remove-listener rpcq nvmf_subsystem_remove_listener "$(laddr $LPORT)"
    check target-live-dropped live_dropped
    check target-live-first-reads first_reads
    check target-live-delete rpcq nvmf_delete_subsystem "{\"nqn\": \"$LNQN\"}"
    check target-live-deleted live_gone
    nvme disconnect -n $LNQN > /dev/null 2>&1
    check target-live-first-reads-after first_reads
    check target-live-disconnect-first nvme disconnect -n $TNQN
fi

check target-alive kill -0 $TPID
kill -TERM $TPID
check target-stop sh -c "for i in \$(seq 100); do kill -0 $TPID 2>/dev/null || exit 0; sleep 0.1; done; exit 1"
sed 's/^/   target: /' /tmp/target.log | tail -n 20
