#!/bin/bash
# Build the guest kernel + initramfs used by run.sh (pollux's guest tests).
#
# Everything comes from Debian packages (apt-get download + dpkg -x), cached in
# $GUEST_CACHE (default ~/.cache/pollux-guest, or ~/.cache/pollux-guest-$KSUITE).
# KSUITE=bookworm-backports takes the kernel from that suite (6.12).
# Idempotent: downloads only
# missing .debs and does nothing when the outputs are newer than this script
# and init.
#
# Host tools (qemu-system-x86_64, cpio, xz, modprobe/depmod, flock) are
# installed with apt-get when missing; that needs root (otherwise the script
# says which packages to install and stops).
#
# Outputs: $GUEST_CACHE/vmlinux (uncompressed kernel, booted through its PVH
#          entry point) and $GUEST_CACHE/initramfs.cpio (uncompressed cpio).
# Both are left uncompressed on purpose: decompressing under TCG costs seconds.
# Env: GUEST_CACHE, KVER (e.g. 6.1.0-56-amd64; default: what linux-image-amd64
#      points to), FORCE=1 (rebuild the initramfs even if up to date).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${GUEST_CACHE:-$HOME/.cache/pollux-guest${KSUITE:+-$KSUITE}}
OUT_KERNEL=$CACHE/vmlinux
OUT_INITRD=$CACHE/initramfs.cpio

# Userland packages wanted in the guest (their lib* dependencies are added).
PACKAGES=(busybox-static fio nvme-cli)
# Kernel modules wanted in the guest (their dependencies and softdeps are added).
MODULES=(nvme nvme-tcp nvmet nvmet-tcp crc32c_generic crc32c-intel vfio-pci vfio_iommu_type1 uio_pci_generic
         null_blk loop brd configfs crc64_rocksoft_generic crct10dif_generic crct10dif_pclmul ext4)
# Taken when the kernel has them (6.12 from bookworm-backports: in-band
# authentication, CONFIG_NVME_AUTH=m, and the crypto it loads by name).
OPT_MODULES=(nvme-auth nvme-keyring dh_generic hmac sha256_generic sha512_generic sha3_generic)

log() { echo "build.sh: $*" >&2; }

# --- host tools -------------------------------------------------------------------
# tool -> Debian package. apt-get/dpkg are assumed (Debian/Ubuntu host).
declare -A HOST_TOOLS=([qemu-system-x86_64]=qemu-system-x86 [cpio]=cpio [xz]=xz-utils
                       [modprobe]=kmod [depmod]=kmod [flock]=util-linux [truncate]=coreutils
                       [timeout]=coreutils [zstd]=zstd)
APT_UPDATED=0
apt_update_once() { ((APT_UPDATED)) || { apt-get update -qq; APT_UPDATED=1; }; }
need=()
for t in "${!HOST_TOOLS[@]}"; do
    command -v "$t" >/dev/null || need+=("${HOST_TOOLS[$t]}")
done
if ((${#need[@]})); then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    if ((EUID != 0)); then
        log "missing host packages: ${need[*]}; run as root or: apt-get install ${need[*]}"; exit 1
    fi
    log "installing host packages: ${need[*]}"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
for t in apt-get dpkg "${!HOST_TOOLS[@]}"; do
    command -v "$t" >/dev/null || { log "missing host tool: $t"; exit 1; }
done

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9      # concurrent run.sh calls: one builder at a time

if [[ -z ${FORCE:-} && -s $OUT_KERNEL && $OUT_INITRD -nt $0 && $OUT_INITRD -nt $HERE/init ]]; then
    log "up to date: $OUT_INITRD"; exit 0
fi

mkdir -p "$CACHE/debs"
apt-cache show fio >/dev/null 2>&1 || apt_update_once

# --- which packages -----------------------------------------------------------
# KSUITE=bookworm-backports takes the kernel from that suite (6.12: iommufd,
# VFIO cdev); apt lists for it live in the cache, the host's apt setup is untouched.
KAPT=()
if [[ -n ${KSUITE:-} ]]; then
    mkdir -p "$CACHE/apt-$KSUITE/lists/partial"
    # the Debian archive this machine's apt already uses (its first URIs: / deb line)
    ARCHIVE=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [[ -n $ARCHIVE ]] || ARCHIVE=$(awk '$1=="deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
    [[ -n $ARCHIVE ]] || { echo "build.sh: no Debian archive in apt's sources" >&2; exit 1; }
    echo "deb $ARCHIVE $KSUITE main" >"$CACHE/apt-$KSUITE/sources.list"
    KAPT=(-o "Dir::Etc::SourceList=$CACHE/apt-$KSUITE/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$CACHE/apt-$KSUITE/lists")
    compgen -G "$CACHE/apt-$KSUITE/lists/*Packages*" >/dev/null || apt-get "${KAPT[@]}" update -qq
fi
if [[ -z ${KVER:-} ]]; then
    KVER=$(apt-cache "${KAPT[@]}" depends linux-image-amd64 | awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {sub("linux-image-","",$2); print $2; exit}')
fi
[[ -n $KVER ]] || { log "cannot determine kernel version; set KVER"; exit 1; }

# Closure of PACKAGES over Depends/Pre-Depends, following only library packages
# (fio also depends on python3 etc., which the binary itself does not need).
lib_closure() {
    local -A seen=(); local level=("$@") next d p
    while ((${#level[@]})); do
        for p in "${level[@]}"; do seen[$p]=1; echo "$p"; done
        mapfile -t next < <(apt-cache depends --no-recommends --no-suggests --no-conflicts \
                --no-breaks --no-replaces --no-enhances "${level[@]}" 2>/dev/null |
            awk '$1 ~ /^\|?(Pre)?Depends:$/ && $2 ~ /^(lib|zlib1g$)/ {print $2}' | sort -u)
        level=(); for d in "${next[@]}"; do [[ -n ${seen[$d]:-} ]] || level+=("$d"); done
    done
}
mapfile -t USERPKGS < <(lib_closure "${PACKAGES[@]}")
KPKG=linux-image-$KVER

# --- download (only what is missing) -------------------------------------------
missing=()
for p in "${USERPKGS[@]}"; do
    compgen -G "$CACHE/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
    log "downloading ${#missing[@]} packages"
    (cd "$CACHE/debs" && apt-get download -qq "${missing[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
    for p in "${missing[@]}"; do
        compgen -G "$CACHE/debs/${p}_*.deb" >/dev/null || { log "failed to download $p"; exit 1; }
    done
fi

if ! compgen -G "$CACHE/debs/${KPKG}_*.deb" >/dev/null; then
    log "downloading $KPKG"
    (cd "$CACHE/debs" && apt-get "${KAPT[@]}" download -qq "$KPKG" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
    compgen -G "$CACHE/debs/${KPKG}_*.deb" >/dev/null || { log "failed to download $KPKG"; exit 1; }
fi

# --- extract ---------------------------------------------------------------------
STAGE=$CACHE/stage      # all userland packages unpacked here
KROOT=$CACHE/kernel     # kernel package unpacked here
extract() {  # deb destdir
    local mark="$2/.x-$(basename "$1")"
    [[ -e $mark ]] || { dpkg -x "$1" "$2"; touch "$mark"; }
}
mkdir -p "$STAGE" "$KROOT"
for p in "${USERPKGS[@]}"; do for deb in "$CACHE/debs/${p}"_*.deb; do extract "$deb" "$STAGE"; done; done
for deb in "$CACHE/debs/${KPKG}"_*.deb; do extract "$deb" "$KROOT"; done
[[ -e $KROOT/lib/modules/$KVER/modules.dep ]] || depmod -b "$KROOT" "$KVER"   # postinst's job
# vmlinux = the xz payload of Debian's bzImage; QEMU boots it via its PVH note
# (falls back to the bzImage if that extraction does not give an ELF file)
vmlinuz=$KROOT/boot/vmlinuz-$KVER
off=$(grep -abo $'\xfd7zXZ' "$vmlinuz" | head -1 | cut -d: -f1 || true)
if [[ -n $off ]]; then
    tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream > "$OUT_KERNEL.tmp" 2>/dev/null || true
else  # newer kernels: zstd payload
    off=$(grep -abo $'\x28\xb5\x2f\xfd' "$vmlinuz" | head -1 | cut -d: -f1 || true)
    : >"$OUT_KERNEL.tmp"
    [[ -n $off ]] && command -v zstd >/dev/null && { tail -c +$((off + 1)) "$vmlinuz" | zstd -dc > "$OUT_KERNEL.tmp" 2>/dev/null || true; }
fi
[[ $(head -c4 "$OUT_KERNEL.tmp") == $'\x7fELF' ]] || cp "$vmlinuz" "$OUT_KERNEL.tmp"
mv "$OUT_KERNEL.tmp" "$OUT_KERNEL"

# --- assemble the root file system -------------------------------------------------
ROOT=$CACHE/root
rm -rf "$ROOT"
mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,dev,proc,sys,run,tmp,root,mnt,etc/nvme}
for d in bin sbin lib lib64; do ln -s usr/$d "$ROOT/$d"; done   # merged /usr

# busybox and its applet links (existing files win, e.g. the real fio/nvme)
install -m755 "$STAGE/bin/busybox" "$ROOT/usr/bin/busybox"
"$ROOT/usr/bin/busybox" --list-full | while read -r a; do
    [[ $a == */* ]] || continue; a=${a#usr/}   # bin/ls, sbin/ip, usr/bin/awk -> usr/...
    [[ -e $ROOT/usr/$a ]] || ln -s /usr/bin/busybox "$ROOT/usr/$a"
done

# dynamically linked tools + the shared libraries they load, resolved with the
# *staged* glibc loader (so the host needs none of these packages installed)
LDSO=$STAGE/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
LIBPATH=$(find "$STAGE" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)
copy_with_libs() {  # staged binary path, e.g. /usr/bin/fio
    install -D -m755 "$STAGE$1" "$ROOT$1"
    "$LDSO" --library-path "$LIBPATH" --list "$STAGE$1" | awk '$2=="=>" {print $1, $3}' |
    while read -r name path; do
        case $path in
            "$STAGE"/*) install -D -m644 "$path" "$ROOT${path#"$STAGE"}" ;;
            *) log "ERROR: $1 needs $name, not found in staged packages ($path)"; exit 1 ;;
        esac
    done
}
copy_with_libs /usr/bin/fio
copy_with_libs /usr/sbin/nvme
install -m755 "$LDSO" "$ROOT/usr/lib64/ld-linux-x86-64.so.2"

# kernel modules: MODULES plus dependencies/softdeps, then a fresh modules.dep
MODDIR=lib/modules/$KVER
mkdir -p "$ROOT/usr/$MODDIR"
cp "$KROOT/$MODDIR"/modules.{order,builtin,builtin.modinfo} "$ROOT/usr/$MODDIR/"
for m in "${MODULES[@]}" "${OPT_MODULES[@]}"; do
    if ! modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" >/dev/null 2>&1; then
        [[ " ${OPT_MODULES[*]} " == *" $m "* ]] && continue
        log "kernel $KVER has no module $m"; exit 1
    fi
    modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1=="insmod" {print $2}'
done | sort -u | while read -r ko; do
    install -D -m644 "$ko" "$ROOT/usr/${ko#"$KROOT"/}"
done
depmod -b "$ROOT" "$KVER"

# config files
uuid=$(cat /proc/sys/kernel/random/uuid)
echo "nqn.2014-08.org.nvmexpress:uuid:$uuid" > "$ROOT/etc/nvme/hostnqn"
echo "$uuid" > "$ROOT/etc/nvme/hostid"
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"
echo "root:x:0:" > "$ROOT/etc/group"
echo "127.0.0.1 localhost guest" > "$ROOT/etc/hosts"
install -m755 "$HERE/init" "$ROOT/init"

# --- pack ----------------------------------------------------------------------------
(cd "$ROOT" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$OUT_INITRD.tmp"
mv "$OUT_INITRD.tmp" "$OUT_INITRD"
log "kernel $KVER: $OUT_KERNEL"
log "initramfs: $OUT_INITRD ($(du -h "$OUT_INITRD" | cut -f1), $(du -sh "$ROOT" | cut -f1) unpacked)"
