# Linux's native NVMe multipath (CONFIG_NVME_MULTIPATH=y, nvme_core.multipath=Y)
# against two `pollux target` processes exporting one namespace: the same
# file through io_uring (--uring), the same subsystem NQN and namespace
# UUID (--ns-uuid), disjoint controller ID ranges (--cntlid-range), ANA
# reporting (--ana-state), on two ports. Linux must make one namespace
# (/dev/nvmeXn1) with two paths (nvmeXcYn1, nvmeXcZn1), then:
#   multipath-paths      two paths, both ANA optimized, one block device;
#   multipath-ana-move   one listener set inaccessible over JSON-RPC
#                        (nvmf_subsystem_listener_set_ana_state, with
#                        `pollux rpc`): its path reads "inaccessible" in
#                        sysfs (the ANA Change event and log page), and
#                        fio's I/O (verified) goes through the other path
#                        only (per-path I/O counters in /sys/block/*/stat);
#   multipath-ana-reload the same through target 1's configuration file
#                        (it runs from -c): SIGHUP with the file unchanged
#                        undoes the JSON-RPC change (optimized again); the
#                        file's listener set inaccessible + SIGHUP moves
#                        fio's I/O to the other path; back to optimized;
#   multipath-kill-verify the listener back to optimized, round-robin
#                        over both paths, one target killed (SIGKILL)
#                        during `fio --verify`: fio finishes, zero errors.
# Runs INSIDE the guest (busybox sh), sourced by suite.sh (uses its
# check/result helpers and $P), or alone with P set.
MP_NQN=nqn.2026-11.dev.pollux:guest-multipath
MP_UUID=6b1e0a51-2c4d-4e8f-9a01-0123456789ab
MP_ADDR=127.0.0.1
MP_PORT1=4436
MP_PORT2=4437
MP_IMG=/tmp/mp.img
P=${P:-/opt/pollux}

if ! command -v check > /dev/null 2>&1; then
    result() { echo "RESULT $1 $2"; }
    check() {
        name=$1; shift
        echo "== $name: $*"
        if "$@"; then result "$name" ok; else result "$name" FAIL; fi
    }
fi

# Target 1's configuration file: what target 2's quick flags say, its
# listener in ANA state $1.
mp_conf() {
    cat > /tmp/mp1.json <<EOF
{"subsystems": [
 {"subsystem": "bdev", "config": [
  {"method": "bdev_uring_create", "params": {"name": "Uring0", "filename": "$MP_IMG"}}]},
 {"subsystem": "nvmf", "config": [
  {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
  {"method": "nvmf_create_subsystem", "params": {"nqn": "$MP_NQN", "allow_any_host": true,
   "ana_reporting": true, "min_cntlid": 1, "max_cntlid": 99}},
  {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$MP_NQN",
   "namespace": {"bdev_name": "Uring0", "uuid": "$MP_UUID"}}},
  {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$MP_NQN", "listen_address":
   {"trtype": "TCP", "adrfam": "IPv4", "traddr": "$MP_ADDR", "trsvcid": "$MP_PORT1"}, "ana_state": "$1"}}]}]}
EOF
}

mp_target() {  # mp_target N PORT CNTLIDS CORE: starts target N (1: from mp_conf's file)
    if [ $1 = 1 ]; then
        mp_conf optimized
        $P target -c /tmp/mp1.json -m $4 -r /tmp/mp$1.sock > /tmp/mp$1.log 2>&1 &
    else
        $P target --uring $MP_IMG --nqn $MP_NQN --ns-uuid $MP_UUID --cntlid-range $3 \
            --listen $MP_ADDR:$2 --ana-state optimized -m $4 -r /tmp/mp$1.sock \
            > /tmp/mp$1.log 2>&1 &
    fi
    eval MP_PID$1=$!
    for i in $(seq 150); do
        # (busybox nc has no -z: the banner's last line says it is up.)
        [ -S /tmp/mp$1.sock ] && grep -q "JSON-RPC on" /tmp/mp$1.log && return 0
        sleep 0.1
    done
    echo "target $1 not up:"; cat /tmp/mp$1.log; return 1
}

# The kernel's path block device (nvmeXcYn1) of the controller connected
# to port $1.
mp_path() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$MP_NQN" ] || continue
        case "$(cat $c/address 2>/dev/null)" in
            *trsvcid=$1*) for p in $c/nvme*c*n1; do [ -e "$p" ] && { echo ${p##*/}; return 0; }; done ;;
        esac
    done
    return 1
}

# The multipath head's block device (/dev/nvmeXn1).
mp_head() {
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ "$(cat $s/subsysnqn 2>/dev/null)" = "$MP_NQN" ] || continue
        for n in $s/nvme*n1; do [ -e "$n" ] && { echo /dev/${n##*/}; return 0; }; done
    done
    return 1
}

mp_subsys() {
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ "$(cat $s/subsysnqn 2>/dev/null)" = "$MP_NQN" ] && { echo $s; return 0; }
    done
    return 1
}

# Reads + writes completed through path $1 (/sys/block/$1/stat).
mp_ios() { awk '{print $1 + $5}' /sys/block/$1/stat; }

mp_wait_state() {  # mp_wait_state PATH STATE: up to 20 s
    for i in $(seq 200); do
        [ "$(cat /sys/block/$1/ana_state 2>/dev/null)" = "$2" ] && return 0
        sleep 0.1
    done
    echo "$1: ana_state $(cat /sys/block/$1/ana_state 2>/dev/null), not $2 after 20 s"
    return 1
}

mp_set() {  # mp_set TARGET PORT STATE
    printf "   rpc: "; $P rpc -s /tmp/mp$1.sock nvmf_subsystem_listener_set_ana_state \
        "{\"nqn\":\"$MP_NQN\",\"listen_address\":{\"trtype\":\"tcp\",\"adrfam\":\"ipv4\",\"traddr\":\"$MP_ADDR\",\"trsvcid\":\"$2\"},\"ana_state\":\"$3\"}"
}

mp_fio() {  # mp_fio NAME SIZE: verified random writes on the head device
    fio --name=$1 --filename=$MP_DEV --rw=randwrite --bs=4k --size=$2 --iodepth=16 \
        --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --randrepeat=0 --output=/tmp/$1.fio > /dev/null 2>&1
    rc=$?
    grep -E "err=|IOPS" /tmp/$1.fio | sed 's/^/   /'
    [ $rc = 0 ] && grep -q "err= 0" /tmp/$1.fio
}

mp_paths() {
    truncate -s 128M $MP_IMG || return 1
    mp_target 1 $MP_PORT1 1-99 0x1 || return 1
    mp_target 2 $MP_PORT2 100-199 0x2 || return 1
    nvme connect -t tcp -a $MP_ADDR -s $MP_PORT1 -n $MP_NQN || return 1
    nvme connect -t tcp -a $MP_ADDR -s $MP_PORT2 -n $MP_NQN || return 1
    for i in $(seq 100); do
        MP_P1=$(mp_path $MP_PORT1) && MP_P2=$(mp_path $MP_PORT2) && MP_DEV=$(mp_head) && [ -b "$MP_DEV" ] && break
        sleep 0.1
    done
    echo "   head $MP_DEV, paths $MP_P1 (port $MP_PORT1) and $MP_P2 (port $MP_PORT2)"
    ls /sys/block | grep nvme | tr '\n' ' '; echo
    [ -n "$MP_P1" ] && [ -n "$MP_P2" ] && [ -b "$MP_DEV" ] || return 1
    [ "$MP_P1" != "$MP_P2" ] || return 1
    # One namespace: one head block device for the subsystem.
    S=$(mp_subsys) || return 1
    [ "$(ls -d $S/nvme*n1 | wc -l)" = 1 ] || { ls $S; return 1; }
    echo "   cntlids: $(cat /sys/class/nvme/*/cntlid | tr '\n' ' ') iopolicy $(cat $S/iopolicy)"
    mp_wait_state $MP_P1 optimized && mp_wait_state $MP_P2 optimized
}

mp_ana_move() {
    mp_set 1 $MP_PORT1 inaccessible || return 1
    mp_wait_state $MP_P1 inaccessible || return 1
    mp_wait_state $MP_P2 optimized || return 1
    a1=$(mp_ios $MP_P1); a2=$(mp_ios $MP_P2)
    mp_fio mp-ana 16M || return 1
    b1=$(mp_ios $MP_P1); b2=$(mp_ios $MP_P2)
    echo "   I/O through $MP_P1 (inaccessible): $((b1 - a1)), through $MP_P2: $((b2 - a2))"
    [ $((b1 - a1)) = 0 ] && [ $((b2 - a2)) -gt 1000 ]
}

mp_ana_reload() {
    # The file still says optimized: a reload undoes mp_ana_move's RPC.
    kill -HUP $MP_PID1 || return 1
    mp_wait_state $MP_P1 optimized || return 1
    mp_conf inaccessible
    kill -HUP $MP_PID1 || return 1
    mp_wait_state $MP_P1 inaccessible || return 1
    mp_wait_state $MP_P2 optimized || return 1
    a1=$(mp_ios $MP_P1); a2=$(mp_ios $MP_P2)
    mp_fio mp-reload 16M || return 1
    b1=$(mp_ios $MP_P1); b2=$(mp_ios $MP_P2)
    echo "   I/O through $MP_P1 (inaccessible by reload): $((b1 - a1)), through $MP_P2: $((b2 - a2))"
    [ $((b1 - a1)) = 0 ] && [ $((b2 - a2)) -gt 1000 ] || return 1
    mp_conf optimized
    kill -HUP $MP_PID1 || return 1
    mp_wait_state $MP_P1 optimized
}

mp_kill_verify() {
    mp_set 1 $MP_PORT1 optimized || return 1
    mp_wait_state $MP_P1 optimized || return 1
    echo round-robin > $(mp_subsys)/iopolicy
    a1=$(mp_ios $MP_P1); a2=$(mp_ios $MP_P2)
    mp_fio mp-kill 48M &
    F=$!
    # Killed once both paths carry I/O.
    for i in $(seq 200); do
        [ $(($(mp_ios $MP_P1) - a1)) -gt 200 ] && [ $(($(mp_ios $MP_P2) - a2)) -gt 200 ] && break
        sleep 0.1
    done
    echo "   before the kill: $(($(mp_ios $MP_P1) - a1)) I/O through $MP_P1, $(($(mp_ios $MP_P2) - a2)) through $MP_P2; SIGKILL to target 1"
    kill -KILL $MP_PID1
    wait $F
    rc=$?
    echo "   after: $(($(mp_ios $MP_P2) - a2)) I/O through $MP_P2; $MP_P1 $(cat /sys/block/$MP_P1/ana_state 2>/dev/null) state $(cat /sys/class/nvme/*/state | tr '\n' ' ')"
    return $rc
}

multipath_checks() {
    modprobe nvme-tcp 2>/dev/null
    echo "   nvme_core multipath: $(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)"
    check multipath-paths mp_paths
    check multipath-ana-move mp_ana_move
    check multipath-ana-reload mp_ana_reload
    check multipath-kill-verify mp_kill_verify
    nvme disconnect -n $MP_NQN > /dev/null 2>&1
    for p in $MP_PID1 $MP_PID2; do kill -TERM $p 2>/dev/null; wait $p 2>/dev/null; done
    rm -f $MP_IMG /tmp/mp1.sock /tmp/mp2.sock /tmp/mp-ana.fio /tmp/mp-reload.fio /tmp/mp-kill.fio /tmp/mp1.json
}
