# Sourced by the scripts in scripts/ and bench/: makes sure a Rust toolchain
# and the Debian packages the tests use are present (installs them as root
# on Debian when missing). Prints what it installs.
need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v python3 >/dev/null || need_apt+=(python3)
# SPDK's own JSON-RPC client (PyPI's `spdk`) is installed into a venv by
# crates/cli/tests/rpc.rs.
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if ! command -v cargo >/dev/null; then
    [[ -x $HOME/.cargo/bin/cargo ]] && export PATH=$HOME/.cargo/bin:$PATH
fi
if ! command -v cargo >/dev/null; then
    # No rustup toolchain: fall back to Debian's (new enough on Debian 13+).
    need_apt+=(cargo rustc rustfmt rust-clippy)
fi
if ((${#need_apt[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "installing: ${need_apt[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
        echo "missing: ${need_apt[*]} (run as root on Debian to install them)" >&2
        exit 1
    fi
fi
min_rust=1.87
have=$(rustc --version | awk '{print $2}')
if [[ $(printf '%s\n%s\n' "$min_rust" "$have" | sort -V | head -1) != "$min_rust" ]]; then
    echo "rustc $have is older than $min_rust, which pollux needs; install a newer toolchain (rustup)" >&2
    exit 1
fi
