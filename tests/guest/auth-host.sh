# In-band authentication (DH-HMAC-CHAP): pollux's NVMe/TCP host against
# Linux's nvmet (CONFIG_NVME_TARGET_AUTH, the 6.12 kernel of
# KSUITE=bookworm-backports; Debian's 6.1 has no target authentication:
# then every check here is skipped with a SKIP line). One-way and
# bidirectional, each with a wrong secret refused, and a sweep of hashes and
# DH groups. Runs INSIDE the guest (busybox sh): sourced by suite.sh (from
# /opt/auth-host.sh), or alone:
#
#   KSUITE=bookworm-backports tests/guest/run.sh \
#       --extra-file target/x86_64-unknown-linux-gnu/guest/pollux:/opt/pollux \
#       --extra-file tests/guest/auth-host.sh:/opt/auth-host.sh -- '. /opt/auth-host.sh'
#
# Keys come from nvme-cli (`nvme gen-dhchap-key`), as a user makes them.
# Prints `RESULT <name> ok|FAIL` per check (suite.sh's convention).
P=${P:-/opt/pollux}
if ! command -v result > /dev/null 2>&1; then
    result() { echo "RESULT $1 $2"; }
fi
auth_check() {  # auth_check NAME CMD...
    name=$1; shift
    echo "== $name: $*"
    if "$@" > /tmp/auth.out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/auth.out | tail -n 30
    if [ $rc = 0 ]; then result "$name" ok; else result "$name" FAIL; fi
    return $rc
}
auth_expect_fail() {  # auth_expect_fail NAME PATTERN CMD...: CMD must fail printing PATTERN
    name=$1; pat=$2; shift 2
    echo "== $name: $* (must fail with '$pat')"
    if "$@" > /tmp/auth.out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/auth.out | tail -n 20
    if [ $rc != 0 ] && grep -q "$pat" /tmp/auth.out; then result "$name" ok; else result "$name" FAIL; fi
}

AUTH_NQN=nqn.2026-01.io.pollux:guest-auth
AUTH_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-1111-2222-3333-444444444444
AUTH_PORT=4430
ACFG=/sys/kernel/config/nvmet
AUTH_TRID="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:$AUTH_PORT subnqn:$AUTH_NQN hostnqn:$AUTH_HOSTNQN ctrl_loss_tmo:0"
AH=$ACFG/hosts/$AUTH_HOSTNQN
K=/tmp/auth-keys

auth_setup() {
    # A file of its own as the namespace (buffered: /tmp takes no O_DIRECT).
    truncate -s 64M /tmp/auth-ns.img || return 1
    modprobe nvmet && modprobe nvmet-tcp || return 1
    [ -d $ACFG ] || mount -t configfs configfs /sys/kernel/config
    mkdir -p $K
    # host key (SHA-256 transformation), controller key (none), and wrong
    # ones of the same shapes.
    nvme gen-dhchap-key --key-length=32 --hmac=1 --nqn=$AUTH_HOSTNQN > $K/host || return 1
    nvme gen-dhchap-key --key-length=48 --hmac=0 > $K/ctrl || return 1
    nvme gen-dhchap-key --key-length=32 --hmac=1 --nqn=$AUTH_HOSTNQN > $K/host-wrong || return 1
    nvme gen-dhchap-key --key-length=48 --hmac=0 > $K/ctrl-wrong || return 1
    echo "   keys: host $(cut -c1-10 $K/host)... ctrl $(cut -c1-10 $K/ctrl)..."
    mkdir $AH || return 1
    cat $K/host > $AH/dhchap_key || return 1
    echo "hmac(sha256)" > $AH/dhchap_hash && echo ffdhe2048 > $AH/dhchap_dhgroup || return 1
    S=$ACFG/subsystems/$AUTH_NQN
    mkdir $S && echo 0 > $S/attr_allow_any_host || return 1
    ln -s $AH $S/allowed_hosts/ || return 1
    mkdir $S/namespaces/1 && echo -n /tmp/auth-ns.img > $S/namespaces/1/device_path &&
        echo 1 > $S/namespaces/1/buffered_io && echo 1 > $S/namespaces/1/enable || return 1
    PT=$ACFG/ports/30
    mkdir $PT || return 1
    echo ipv4 > $PT/addr_adrfam && echo tcp > $PT/addr_trtype &&
        echo 127.0.0.1 > $PT/addr_traddr && echo $AUTH_PORT > $PT/addr_trsvcid || return 1
    ln -s $S $PT/subsystems/$AUTH_NQN
}

auth_perf() {  # auth_perf NAME TRID-EXTRA ARGS...: a short verified run; ok if I/Os done, no errors
    name=$1; extra=$2; shift 2
    echo "== $name: pollux perf -r '$AUTH_TRID $extra' $*"
    if $P perf -r "$AUTH_TRID $extra" --json "$@" > /tmp/auth.json 2> /tmp/auth.err; then rc=0; else rc=$?; fi
    tail -n 20 /tmp/auth.err | sed 's/^/   /'
    ios=$(sed -n 's/.*"total":{[^}]*"ios":\([0-9]*\).*/\1/p' /tmp/auth.json)
    errs=$(sed -n 's/.*"total":{[^}]*"errors":\([0-9]*\).*/\1/p' /tmp/auth.json)
    echo "   rc=$rc ios=${ios:-?} errors=${errs:-?}"
    if [ $rc = 0 ] && [ "${errs:-1}" = 0 ] && [ "${ios:-0}" -gt 0 ]; then
        result "$name" ok
    else
        result "$name" FAIL
    fi
}

auth_supported() {  # nvmet with DH-HMAC-CHAP: a host entry has dhchap_key
    modprobe nvmet 2> /dev/null || return 1
    [ -d $ACFG ] || mount -t configfs configfs /sys/kernel/config
    probe=$ACFG/hosts/nqn.2026-01.io.pollux:auth-probe
    mkdir -p $probe || return 1
    [ -e $probe/dhchap_key ]; r=$?
    rmdir $probe
    return $r
}

echo "===== DH-HMAC-CHAP: pollux host -> Linux nvmet ====="
if ! auth_supported; then
    echo "SKIP auth-host: this kernel's nvmet has no DH-HMAC-CHAP (CONFIG_NVME_TARGET_AUTH: boot the 6.12 guest, KSUITE=bookworm-backports)"
elif auth_check auth-host-setup auth_setup; then
    # One-way: the controller checks the host.
    auth_perf auth-host-oneway "dhchap_key:$K/host" -w randrw -M 50 -q 8 -o 4096 -t 1 --verify
    auth_expect_fail auth-host-oneway-wrong-key "AUTH_Failure1" $P perf -r "$AUTH_TRID dhchap_key:$K/host-wrong" -t 1
    auth_expect_fail auth-host-no-key "no DH-HMAC-CHAP key is configured" $P perf -r "$AUTH_TRID" -t 1
    # Bidirectional: the host checks the controller too.
    cat $K/ctrl > $AH/dhchap_ctrl_key
    auth_perf auth-host-bidi "dhchap_key:$K/host dhchap_ctrlr_key:$K/ctrl" -w randrw -M 50 -q 8 -o 4096 -t 1 --verify
    auth_expect_fail auth-host-bidi-wrong-ctrl-key "wrong controller secret" $P perf -r "$AUTH_TRID dhchap_key:$K/host dhchap_ctrlr_key:$K/ctrl-wrong" -t 1
    auth_expect_fail auth-host-bidi-wrong-host-key "AUTH_Failure1" $P perf -r "$AUTH_TRID dhchap_key:$K/host-wrong dhchap_ctrlr_key:$K/ctrl" -t 1
    # Every hash, and the groups up to ffdhe4096 (nvmet picks what it is
    # given); AUTH_ALL_GROUPS=1 adds ffdhe6144 and ffdhe8192, whose
    # kernel-side DH takes some 10-20 s under TCG.
    sweep="sha256:null sha384:ffdhe3072 sha512:ffdhe4096 sha512:ffdhe2048"
    [ -n "${AUTH_ALL_GROUPS:-}" ] && sweep="$sweep sha256:ffdhe6144 sha384:ffdhe8192"
    for hg in $sweep; do
        h=${hg%%:*}; g=${hg#*:}
        echo "hmac($h)" > $AH/dhchap_hash && echo $g > $AH/dhchap_dhgroup
        auth_perf auth-host-$h-$g "dhchap_key:$K/host dhchap_ctrlr_key:$K/ctrl" -w randread -q 4 -o 4096 -t 1
    done
    # A group the host does not offer: refused.
    echo "hmac(sha256)" > $AH/dhchap_hash && echo ffdhe3072 > $AH/dhchap_dhgroup
    auth_expect_fail auth-host-group-not-offered "DH group" $P perf -r "$AUTH_TRID dhchap_key:$K/host dhchap_dhgroups:ffdhe2048" -t 1
    dmesg | grep -i "nvmet.*auth\|dhchap" | tail -n 12 | sed 's/^/   dmesg: /'
fi
