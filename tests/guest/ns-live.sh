# Namespaces added and removed live on `pollux target` while Linux's host
# is connected: the kernel must see the Namespace Attribute Changed event,
# read the Changed Namespace List and rescan (a new /dev/nvmeXn2 appears,
# then goes). Runs INSIDE the guest (busybox sh), sourced by suite.sh
# after target.sh (uses its `check`/`result` and $P): `bdev_malloc_create`,
# `nvmf_subsystem_add_ns` and `_remove_ns` go over the target's JSON-RPC
# socket (`pollux target -r`) with `pollux rpc` (the guest has no Python).
NS_NQN=nqn.2026-11.dev.pollux:guest-ns-live
NS_ADDR=127.0.0.1
NS_PORT=4434
NS_SOCK=/tmp/ns-live.sock

if ! command -v check > /dev/null 2>&1; then
    result() { echo "RESULT $1 $2"; }
    check() {
        name=$1; shift
        echo "== $name: $*"
        if "$@"; then result "$name" ok; else result "$name" FAIL; fi
    }
fi

ns_rpc() {  # ns_rpc METHOD PARAMS_JSON: prints the result; fails on an error
    echo "rpc $1 $2"
    $P rpc -s $NS_SOCK "$1" "$2"
}

# The kernel's controller of $NS_NQN (nvmeN).
ns_ctrl() {
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$NS_NQN" ] && { echo ${c##*/}; return 0; }
    done
    return 1
}

# Waits up to 10 s for block device $1 of namespace 2 to exist (want=1)
# or be gone (want=0).
ns_wait() {  # ns_wait DEV WANT
    for i in $(seq 100); do
        if [ -b /dev/$1 ]; then [ $2 = 1 ] && return 0; else [ $2 = 0 ] && return 0; fi
        sleep 0.1
    done
    echo "/dev/$1 did not $( [ $2 = 1 ] && echo appear || echo disappear ) within 10 s"
    ls /dev/nvme* 2>&1
    return 1
}

ns_live_run() {
    $P target --listen $NS_ADDR:$NS_PORT --ram 64MiB --nqn $NS_NQN -m 0x1 -r $NS_SOCK > /tmp/ns-live.log 2>&1 &
    NS_TPID=$!
    for i in $(seq 100); do
        [ -S $NS_SOCK ] && nc -z $NS_ADDR $NS_PORT 2>/dev/null && break
        kill -0 $NS_TPID 2>/dev/null || { echo "target exited:"; cat /tmp/ns-live.log; return 1; }
        sleep 0.1
    done
    nvme connect -t tcp -a $NS_ADDR -s $NS_PORT -n $NS_NQN || return 1
    for i in $(seq 100); do C=$(ns_ctrl) && break; sleep 0.1; done
    [ -n "$C" ] || { echo "no controller for $NS_NQN"; return 1; }
    ns_wait ${C}n1 1 || return 1
    # A second namespace, live: the kernel rescans on the event.
    ns_rpc bdev_malloc_create '{"name":"Live1","num_blocks":16384,"block_size":512}' || return 1
    ns_rpc nvmf_subsystem_add_ns "{\"nqn\":\"$NS_NQN\",\"namespace\":{\"bdev_name\":\"Live1\",\"nsid\":2}}" || return 1
    ns_wait ${C}n2 1 || return 1
    dd if=/dev/urandom of=/tmp/ns-live.in bs=4096 count=256 2>/dev/null
    dd if=/tmp/ns-live.in of=/dev/${C}n2 bs=4096 oflag=direct 2>&1 || return 1
    dd if=/dev/${C}n2 of=/tmp/ns-live.out bs=4096 count=256 iflag=direct 2>&1 || return 1
    cmp /tmp/ns-live.in /tmp/ns-live.out || return 1
    # Removed, live: the block device goes; namespace 1 stays usable.
    ns_rpc nvmf_subsystem_remove_ns "{\"nqn\":\"$NS_NQN\",\"nsid\":2}" || return 1
    ns_wait ${C}n2 0 || return 1
    dd if=/dev/${C}n1 of=/dev/null bs=4096 count=16 iflag=direct 2>&1 || return 1
    [ -b /dev/${C}n1 ] || { echo "/dev/${C}n1 went too"; return 1; }
}

ns_live_checks() {
    modprobe nvme-tcp 2>/dev/null
    check ns-live ns_live_run
    nvme disconnect -n $NS_NQN > /dev/null 2>&1
    [ -n "$NS_TPID" ] && { kill -TERM $NS_TPID 2>/dev/null; wait $NS_TPID 2>/dev/null; }
    rm -f $NS_SOCK /tmp/ns-live.in /tmp/ns-live.out
}
