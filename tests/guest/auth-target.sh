# DH-HMAC-CHAP: Linux's NVMe/TCP host (nvme-cli `connect --dhchap-secret
# [--dhchap-ctrl-secret]`, keys from `nvme gen-dhchap-key`) against
# `pollux target`, in the guest (Linux 6.12: CONFIG_NVME_HOST_AUTH).
# Sourced by suite.sh (uses its check/result helpers and $P).
#
# One target, one subsystem, two hosts: host 1 authenticates one-way
# (--host H1 --dhchap-key K1), host 2 bidirectionally (--host H2
# --dhchap-key K2 --dhchap-ctrl-key C2). Each connects with the right
# secrets (a block device, fio verify), then with a wrong one: refused,
# and the target logs the failure with the host NQN.
ANQN=nqn.2026-11.dev.pollux:guest-auth
AADDR=127.0.0.1
APORT=4432
H1=nqn.2014-08.org.nvmexpress:uuid:a0000000-0000-0000-0000-0000000000a1
H2=nqn.2014-08.org.nvmexpress:uuid:a0000000-0000-0000-0000-0000000000a2
modprobe nvme-tcp

auth_keys() {  # the keys, in files only root may read (SPDK's keyring rule)
    mkdir -p /tmp/auth && chmod 700 /tmp/auth || return 1
    ( umask 077
      nvme gen-dhchap-key --hmac=1 --nqn=$H1 > /tmp/auth/k1 &&
      nvme gen-dhchap-key --hmac=1 --nqn=$H2 > /tmp/auth/k2 &&
      nvme gen-dhchap-key --hmac=2 --nqn=$ANQN > /tmp/auth/c2 &&
      nvme gen-dhchap-key --hmac=1 --nqn=$H1 > /tmp/auth/wrong &&
      nvme gen-dhchap-key --hmac=2 --nqn=$ANQN > /tmp/auth/cwrong ) || return 1
    chmod 600 /tmp/auth/*
    head -c 10 /tmp/auth/k1; echo "... ($(cat /tmp/auth/* | wc -l) keys)"
    grep -q '^DHHC-1:0[0-3]:' /tmp/auth/k1
}
check auth-gen-keys auth_keys

$P target -r /tmp/auth-target.sock --listen $AADDR:$APORT --ram 128MiB --nqn $ANQN -m 0x1 \
    --host $H1 --dhchap-key /tmp/auth/k1 \
    --host $H2 --dhchap-key /tmp/auth/k2 --dhchap-ctrl-key /tmp/auth/c2 \
    > /tmp/auth-target.log 2>&1 &
APID=$!
auth_target_up() {
    for i in $(seq 100); do
        grep -q "listening" /tmp/auth-target.log 2>/dev/null && return 0
        kill -0 $APID 2>/dev/null || { echo "target exited:"; cat /tmp/auth-target.log; return 1; }
        sleep 0.1
    done
    echo "target not listening after 10 s"; cat /tmp/auth-target.log; return 1
}
if check auth-target-start auth_target_up; then

adev() {  # the kernel's block device of $ANQN
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$ANQN" ] || continue
        for i in $(seq 100); do
            for b in /sys/class/nvme/${c##*/}/nvme*n1 /sys/block/${c##*/}n1; do
                [ -e "$b" ] && { n=${b##*/}; [ -b /dev/$n ] && { echo /dev/$n; return 0; }; }
            done
            sleep 0.1
        done
    done
    return 1
}
auth_io() {  # a block device, data written and verified
    D=$(adev) || { echo "no block device"; return 1; }
    fio --name=verify --filename=$D --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --size=16M --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --output-format=terse --minimal > /tmp/fio.out 2>&1 || { cat /tmp/fio.out; return 1; }
    echo "$D: fio 4k randwrite+verify ok"
}
aconnect() {  # aconnect HOSTNQN SECRETFILE [CTRLSECRETFILE]
    set -- -t tcp -a $AADDR -s $APORT -n $ANQN --hostnqn=$1 --dhchap-secret="$(cat $2)" \
        ${3:+--dhchap-ctrl-secret="$(cat $3)"}
    nvme connect "$@"
}
refused_logged() {  # the target logged a failed authentication of host $1
    for i in $(seq 50); do
        grep "authentication failed" /tmp/auth-target.log | grep -q "$1" && {
            grep "authentication failed" /tmp/auth-target.log | grep "$1" | tail -n 1; return 0; }
        sleep 0.1
    done
    echo "no WARN for $1:"; tail -n 20 /tmp/auth-target.log; return 1
}
no_controller() {  # nothing of $ANQN left connected
    for c in /sys/class/nvme/nvme*; do
        [ "$(cat $c/subsysnqn 2>/dev/null)" = "$ANQN" ] && { echo "controller ${c##*/} still there"; return 1; }
    done
    return 0
}
must_fail() {  # must_fail NAME CMD...: CMD must fail
    name=$1; shift
    echo "== $name: $* (must fail)"
    if "$@" > /tmp/out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/out
    if [ $rc != 0 ]; then result "$name" ok; else result "$name" FAIL; fi
}
no_key_in_log() { ! grep -q "DHHC-1" /tmp/auth-target.log; }

# One-way.
if check auth-oneway-connect aconnect $H1 /tmp/auth/k1; then
    check auth-oneway-io auth_io
    check auth-oneway-disconnect nvme disconnect -n $ANQN
fi
must_fail auth-oneway-wrong-secret aconnect $H1 /tmp/auth/wrong
check auth-oneway-wrong-logged refused_logged $H1
nvme disconnect -n $ANQN > /dev/null 2>&1
check auth-oneway-wrong-no-controller no_controller
# Bidirectional.
if check auth-bidi-connect aconnect $H2 /tmp/auth/k2 /tmp/auth/c2; then
    check auth-bidi-io auth_io
    check auth-bidi-disconnect nvme disconnect -n $ANQN
fi
must_fail auth-bidi-wrong-host-secret aconnect $H2 /tmp/auth/wrong /tmp/auth/c2
check auth-bidi-wrong-host-logged refused_logged $H2
nvme disconnect -n $ANQN > /dev/null 2>&1
# The controller proves a wrong secret: Linux refuses it (AUTH_Failure2).
must_fail auth-bidi-wrong-ctrl-secret aconnect $H2 /tmp/auth/k2 /tmp/auth/cwrong
nvme disconnect -n $ANQN > /dev/null 2>&1
check auth-bidi-wrong-no-controller no_controller
# A host with a key that connects without one: Linux is asked to
# authenticate (AUTHREQ.ATR) and has no secret: refused.
must_fail auth-no-secret nvme connect -t tcp -a $AADDR -s $APORT -n $ANQN --hostnqn=$H1
nvme disconnect -n $ANQN > /dev/null 2>&1
check auth-no-key-in-log no_key_in_log

check auth-target-alive kill -0 $APID
kill -TERM $APID
check auth-target-stop sh -c "for i in \$(seq 100); do kill -0 $APID 2>/dev/null || exit 0; sleep 0.1; done; exit 1"
fi
sed 's/^/   target: /' /tmp/auth-target.log | tail -n 30
