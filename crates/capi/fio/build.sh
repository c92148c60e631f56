#!/usr/bin/env bash
# Builds the fio external ioengine libpollux_fio.so against the fio Debian
# ships: its headers come from Debian's source package (`apt-get source
# fio`), configured once, cached under target/fio-src/. Installs fio,
# dpkg-dev and a deb-src line when missing (as root on Debian).
#
#   crates/capi/fio/build.sh [PROFILE]   # PROFILE: debug (default) or release
# Prints the path of the engine on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
profile=${1:-debug}
target=${CARGO_TARGET_DIR:-$root/target}
cache=$target/fio-src

need=()
command -v fio >/dev/null || need+=(fio)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v cc >/dev/null || need+=(gcc)
if ((${#need[@]})); then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
ver=$(dpkg-query -W -f='${Version}' fio)
src=$cache/$ver
if [[ ! -f $src/.configured ]]; then
    if ! grep -rqs '^deb-src\|^Types:.*deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
        echo "adding a deb-src line for $codename" >&2
        # deb822, with the key debian.sources names (a one-line entry for
        # the same URI without it conflicts with debian.sources).
        key=/usr/share/keyrings/debian-archive-keyring.gpg
        printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\n%s' \
            "$codename" "$([[ -f $key ]] && echo "Signed-By: $key")" >/etc/apt/sources.list.d/pollux-deb-src.sources
        apt-get update -qq
    fi
    rm -rf "$src" && mkdir -p "$src"
    # The source of the installed version (its headers match the binary).
    (cd "$src" && apt-get source -qq --download-only "fio=$ver" >&2 &&
        dpkg-source -x --no-check ./*.dsc tree >&2)
    # fio's engines include config-host.h, which ./configure writes.
    (cd "$src/tree" && ./configure >/dev/null)
    touch "$src/.configured"
fi
tree=$src/tree
lib=$target/$profile
if [[ ! -f $lib/libpollux.so ]]; then
    echo "no $lib/libpollux.so: build pollux-capi first (cargo build -p pollux-capi)" >&2
    exit 1
fi
out=$lib/libpollux_fio.so
# fio's own flags for engines: -D_GNU_SOURCE, _LARGEFILE and the
# config-host.h it generated.
cc -O2 -g -fPIC -shared -std=gnu11 -Wall -Wno-unused-parameter \
    -D_GNU_SOURCE -D_LARGEFILE_SOURCE -D_FILE_OFFSET_BITS=64 \
    -include "$tree/config-host.h" -I "$tree" -I "$here/../include" \
    -o "$out" "$here/pollux_fio.c" -L "$lib" -lpollux -Wl,-rpath,"$lib"
echo "$out"
