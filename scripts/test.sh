#!/usr/bin/env bash
# Runs every pollux test: formatting and lint checks, unit tests, the
# integration tests of each crate (driver + emulated controller end to end,
# emulated-controller conformance), and — when the host can boot a QEMU
# guest — the real-hardware-path suite in tests/guest/.
#
# Installs what it needs when run as root on Debian (the Rust toolchain
# only if none is present; see scripts/ensure-deps.sh).
#
#   scripts/test.sh            # everything
#   SKIP_GUEST=1 scripts/test.sh   # host tests only
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== import circles between files"
python3 scripts/import_cycles.py
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# libpollux's .so and .a, which crates/capi/tests/c_example.rs links hello.c
# against: `cargo test` builds the library only as an rlib for its harness.
cargo build --locked -p pollux-capi
cargo test --workspace --locked
echo "== libpollux's header is the one cbindgen makes (build.rs rewrote it if not)"
if git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet -- crates/capi/include/pollux.h; then
    echo "crates/capi/include/pollux.h is stale: commit the regenerated header" >&2
    git diff --stat -- crates/capi/include/pollux.h >&2
    exit 1
fi
echo "== fio verification through the pollux ioengine (fio, Debian's source for its headers)"
crates/capi/fio/test.sh
if [[ -x tests/guest/run-tests.sh && -z ${SKIP_GUEST:-} ]]; then
    echo "== guest tests (QEMU, TCG)"
    tests/guest/run-tests.sh
fi
