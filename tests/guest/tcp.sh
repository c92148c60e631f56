# NVMe/TCP guest checks: pollux's TCP host against Linux's nvmet-tcp
# (configfs) on 127.0.0.1:4420, a brd RAM disk as the namespace. Runs INSIDE
# the guest (busybox sh): sourced by suite.sh (from /opt/tcp.sh), or alone:
#
#   tests/guest/run.sh --extra-file target/x86_64-unknown-linux-gnu/guest/pollux:/opt/pollux \
#       -- "$(cat tests/guest/tcp.sh)"
#
# Prints `RESULT <name> ok|FAIL` per check (suite.sh's convention) and
# `METRIC tcp-* <IOPS>` lines.
P=${P:-/opt/pollux}
if ! command -v result > /dev/null 2>&1; then
    result() { echo "RESULT $1 $2"; }
fi
tcp_check() {  # tcp_check NAME CMD...
    name=$1; shift
    echo "== $name: $*"
    if "$@" > /tmp/tcp.out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/tcp.out | tail -n 40
    if [ $rc = 0 ]; then result "$name" ok; else result "$name" FAIL; fi
    return $rc
}
tcp_expect_fail() {  # tcp_expect_fail NAME PATTERN CMD...
    name=$1; pat=$2; shift 2
    echo "== $name: $* (must fail with '$pat')"
    if "$@" > /tmp/tcp.out 2>&1; then rc=0; else rc=$?; fi
    sed 's/^/   /' /tmp/tcp.out | tail -n 20
    if [ $rc != 0 ] && grep -q "$pat" /tmp/tcp.out; then result "$name" ok; else result "$name" FAIL; fi
}

NQN=nqn.2026-01.io.pollux:guest-tcp
CFG=/sys/kernel/config/nvmet
TCP_TRID="trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4420 subnqn:$NQN"

tcp_setup() {
    # Digests need crc32c; busybox modprobe ignores softdeps, so by hand.
    modprobe crc32c_generic 2> /dev/null
    modprobe crc32c-intel 2> /dev/null
    modprobe brd rd_nr=1 rd_size=65536 || return 1      # /dev/ram0, 64 MiB
    modprobe nvmet && modprobe nvmet-tcp || return 1
    [ -d $CFG ] || mount -t configfs configfs /sys/kernel/config
    S=$CFG/subsystems/$NQN
    mkdir $S && echo 1 > $S/attr_allow_any_host || return 1
    mkdir $S/namespaces/1 && echo -n /dev/ram0 > $S/namespaces/1/device_path &&
        echo 1 > $S/namespaces/1/enable || return 1
    PT=$CFG/ports/1
    mkdir $PT || return 1
    echo ipv4 > $PT/addr_adrfam && echo tcp > $PT/addr_trtype &&
        echo 127.0.0.1 > $PT/addr_traddr && echo 4420 > $PT/addr_trsvcid || return 1
    ln -s $S $PT/subsystems/$NQN
}

tcp_perf() {  # tcp_perf NAME TRID ARGS...: --json run; ok if I/Os done and no errors
    name=$1; trid=$2; shift 2
    echo "== $name: pollux perf -r '$trid' $*"
    if $P perf -r "$trid" --json "$@" > /tmp/tcp.json 2> /tmp/tcp.err; then rc=0; else rc=$?; fi
    tail -n 20 /tmp/tcp.err | sed 's/^/   /'
    iops=$(sed -n 's/.*"total":{[^}]*"iops":\([0-9.]*\).*/\1/p' /tmp/tcp.json | cut -d. -f1)
    ios=$(sed -n 's/.*"total":{[^}]*"ios":\([0-9]*\).*/\1/p' /tmp/tcp.json)
    errs=$(sed -n 's/.*"total":{[^}]*"errors":\([0-9]*\).*/\1/p' /tmp/tcp.json)
    echo "   rc=$rc ios=${ios:-?} errors=${errs:-?} iops=${iops:-?}"
    [ -n "$iops" ] && echo "METRIC $name $iops"
    if [ $rc = 0 ] && [ "${errs:-1}" = 0 ] && [ "${ios:-0}" -gt 0 ]; then
        result "$name" ok
    else
        result "$name" FAIL
    fi
}

echo "===== NVMe/TCP: pollux host -> Linux nvmet-tcp ====="
if tcp_check tcp-nvmet-setup tcp_setup; then
    tcp_check tcp-discover sh -c "$P discover trtype:tcp traddr:127.0.0.1 trsvcid:4420 | tee /dev/stderr | grep -q 'subnqn: *$NQN'"
    tcp_check tcp-discover-json sh -c "$P discover --json trtype:tcp traddr:127.0.0.1 trsvcid:4420 | grep -q '\"subnqn\":\"$NQN\"'"
    tcp_perf tcp-verify-4k "$TCP_TRID" -w randrw -M 50 -q 16 -o 4096 -t 3 --verify
    tcp_perf tcp-verify-128k "$TCP_TRID" -w randrw -M 50 -q 8 -o 128k -t 3 --verify
    tcp_perf tcp-verify-4k-digests "$TCP_TRID hdgst:1 ddgst:1" -w randrw -M 50 -q 16 -o 4096 -t 3 --verify
    tcp_perf tcp-verify-128k-digests "$TCP_TRID hdgst:1 ddgst:1" -w randrw -M 50 -q 8 -o 128k -t 3 --verify
    tcp_perf tcp-verify-2qp "$TCP_TRID" -w randrw -M 70 -q 8 -o 8k -P 2 -t 2 --verify
    tcp_perf tcp-randread-4k "$TCP_TRID" -w randread -q 32 -o 4096 -t 3
    tcp_check tcp-bdevperf-verify $P bdevperf -r /tmp/tcp-bdevperf.sock --nvme "$TCP_TRID" -w verify -q 8 -o 16k -t 2
    # perf's default depth (-q 128), whatever nvmet's queues hold.
    tcp_perf tcp-default-depth "$TCP_TRID" -w randread -o 4096 -t 2
    # Get Log Page at the lengths asked for, a log shorter than that
    # included (crates/tcp/tests/peer.rs).
    if [ -x /opt/tcp-peer-test ]; then
        tcp_check tcp-log-pages env POLLUX_TCP_PEER=127.0.0.1:4420/$NQN /opt/tcp-peer-test --test-threads=1
    fi
    # Linux's nvmet answers Connect Invalid Parameters at SUBNQN: read as such.
    tcp_expect_fail tcp-wrong-subnqn "subsystem nqn.2026-01.io.pollux:nope is not served at 127.0.0.1:4420" $P perf -r "trtype:tcp traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2026-01.io.pollux:nope" -t 1
    tcp_expect_fail tcp-no-listener "127.0.0.1:4421" $P perf -r "trtype:tcp traddr:127.0.0.1 trsvcid:4421 subnqn:$NQN" -t 1
    tcp_expect_fail tcp-bad-key "colour" $P perf -r "$TCP_TRID colour:blue" -t 1
fi
