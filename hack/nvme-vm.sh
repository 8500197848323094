#!/usr/bin/env bash
# Prepares what the NVMe/TCP VM tier boots (e2e/vm, e2e/nvme): a Debian
# kernel and a busybox initramfs carrying the modules for the nvmet target,
# the nvme-tcp initiator (with NVMe in-band authentication where the kernel
# has it), ext4, xfs, loop, 9p and overlay.
#
#   hack/nvme-vm.sh prepare   download/unpack/build what is missing; prints
#                             KERNEL_PACKAGE=, KERNEL=, INITRD= and
#                             KERNEL_NVME_AUTH= (1 when the package's config
#                             has NVMe host and target authentication, else
#                             0) (the default)
#   hack/nvme-vm.sh kernel-package
#                             prints the kernel package prepare would use
#
# The kernel package is pinned: Debian bookworm's 6.12 from
# bookworm-security, whose config has CONFIG_NVME_HOST_AUTH and
# CONFIG_NVME_TARGET_AUTH (issue 26); the 6.1 kernel linux-image-amd64
# depends on has no NVMe authentication. NVME_VM_KERNEL_PACKAGE overrides
# it (e.g. linux-image-6.1.0-56-amd64, or "default" for what
# linux-image-amd64 depends on today). A pinned package apt no longer has
# (Debian removes superseded kernels) and the cache does not hold is
# replaced by the newest of its ABI series apt has, with a message
# (available).
#
# The package is fetched with `apt-get download` and unpacked with
# `dpkg-deb -x` into .cache/nvme-vm/: nothing is installed, nothing goes
# into /boot and no initramfs hook runs. The initramfs is rebuilt only when
# the kernel or this script changes. Tools (qemu-system-x86, busybox-static,
# xz-utils) come from hack/install-deps.sh. Facts behind the choices:
# ../shared/NVME-VM.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NVME_VM_CACHE:-$root/.cache/nvme-vm}
mkdir -p "$cache"

# The pinned kernel (see the header).
default_kernel_package=linux-image-6.12.117+deb12-amd64

# The modules the guest needs; each is loaded after the ones its .modinfo
# depends= names (resolve_modules: the package ships no modules.dep), and
# those built into the kernel (modules.builtin) are left out: 6.12 has
# virtio built in, 6.1 has it as modules. crc32c_generic is ext4's soft
# dependency (crypto-crc32c), which no depends= names. On 6.12 nvme-core
# depends on nvme-auth and nvmet on nvme-auth and nvme-keyring, so the
# authentication modules come with them. virtio_mmio is for -M microvm.
modules=(
  configfs nvme_tcp nvmet nvmet_tcp
  crc32c_generic ext4 xfs loop
  virtio_pci virtio_mmio
  9pnet_virtio 9p overlay
)
die() { echo "nvme-vm: $*" >&2; exit 1; }

kernel_package() {
  local p=${NVME_VM_KERNEL_PACKAGE:-$default_kernel_package}
  if [ "$p" = default ]; then
    # The current ABI of the stable kernel is what the meta package
    # depends on.
    p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    if [ -z "$p" ]; then
      [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 || true
      p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    fi
    [ -n "$p" ] || die "apt-cache knows no linux-image-amd64; run apt-get update (Debian only)"
  fi
  available "$p"
}

# apt_knows reports whether apt has a candidate for package $1. Not
# `apt-cache policy | grep -q`: grep -q quits at the match, apt-cache may
# then die of SIGPIPE, and under pipefail a known package reads as unknown.
apt_knows() {
  local policy
  policy=$(apt-cache policy "$1" 2>/dev/null) || true
  grep -q 'Candidate: [0-9]' <<<"$policy"
}

# apt_update runs apt-get update once (as root; otherwise apt's lists are
# what they are).
apt_updated=0
apt_update() {
  [ "$apt_updated" = 1 ] && return 0
  apt_updated=1
  [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 || true
}

# series prints the prefix and suffix of kernel package $1's ABI series,
# tab-separated (linux-image-6.12.117+deb12-amd64: "linux-image-6.12."
# and "+deb12-amd64"; linux-image-6.1.0-56-amd64: "linux-image-6.1.0-"
# and "-amd64"), or nothing for a name of another form.
series() {
  sed -nE \
    -e 's/^(linux-image-[0-9]+\.[0-9]+\.)[0-9]+(\+deb[0-9]+-[a-z0-9-]+)$/\1\t\2/p' \
    -e 's/^(linux-image-[0-9]+\.[0-9]+\.[0-9]+-)[0-9]+(-[a-z0-9-]+)$/\1\t\2/p' <<<"$1"
}

# newest_of_series prints the newest package of $1's ABI series that apt
# has a candidate for, or nothing.
newest_of_series() {
  local s prefix suffix
  s=$(series "$1")
  [ -n "$s" ] || return 0
  prefix=${s%%$'\t'*} suffix=${s#*$'\t'}
  local re="^${prefix//./\\.}[0-9]+${suffix//+/\\+}\$" p
  apt-cache pkgnames "$prefix" 2>/dev/null | grep -E "$re" | sort -rV | while read -r p; do
    if apt_knows "$p"; then
      echo "$p"
      break
    fi
  done
}

# available resolves kernel package $1 to one apt can download or the cache
# holds: $1 itself, or, when apt no longer has it, the newest of its ABI
# series. Debian removes superseded kernels from bookworm-security (and
# old ABIs from bookworm at point releases), so a pin that worked when it
# was written stops existing on a clean machine; its series has the same
# configuration, which is what the tier relies on.
available() {
  local pkg=$1 p
  if [ -f "$cache/$pkg/.unpacked" ] || apt_knows "$pkg"; then
    echo "$pkg"
    return
  fi
  command -v apt-cache >/dev/null || die "apt-cache is needed to find the kernel package $pkg"
  apt_update
  if apt_knows "$pkg"; then
    echo "$pkg"
    return
  fi
  p=$(newest_of_series "$pkg")
  if [ -n "$p" ]; then
    echo "nvme-vm: the kernel package $pkg is gone from apt (Debian removes superseded kernels); using $p, the newest of its series apt has. Measurements were taken on $pkg: update the pin (hack/nvme-vm.sh, e2e/nvme) to $p once the tier passes on it" >&2
    echo "$p"
    return
  fi
  die "apt cannot find the kernel package $pkg nor another of its series. The 6.12 kernels come from Debian bookworm-security: add 'deb http://deb.debian.org/debian-security bookworm-security main' to /etc/apt/sources.list and run apt-get update, or set NVME_VM_KERNEL_PACKAGE to another kernel package (NVME_VM_KERNEL_PACKAGE=default: the one linux-image-amd64 depends on, without NVMe authentication on bookworm)"
}

# unpack_kernel prints the directory holding boot/ and lib/modules/.
unpack_kernel() {
  local pkg=$1 dir=$cache/$1
  if [ -f "$dir/.unpacked" ]; then
    echo "$dir"
    return
  fi
  command -v apt-get >/dev/null || die "apt-get is needed to download $pkg"
  local dl=$cache/download
  rm -rf "$dl" "$dir"
  mkdir -p "$dl" "$dir"
  # apt drops privileges to _apt for the download; a root-owned directory
  # it cannot write to only earns a warning.
  (cd "$dl" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
  dpkg-deb -x "$dl"/*.deb "$dir"
  rm -rf "$dl"
  touch "$dir/.unpacked"
  echo "$dir"
}

# decompress writes module file $1 uncompressed to stdout: busybox insmod
# reads plain .ko files only (Debian compresses 6.12's with xz).
decompress() {
  case "$1" in
    *.ko.xz) xz -dc "$1" ;;
    *.ko.zst) zstd -dc "$1" ;;
    *.ko.gz) gzip -dc "$1" ;;
    *.ko) cat "$1" ;;
    *) return 1 ;;
  esac
}

# modinfo_field prints field $2 (depends, ...) of module file $1 from its
# .modinfo strings (no modinfo binary needed).
modinfo_field() {
  decompress "$1" | tr '\0' '\n' | sed -n "s/^$2=//p" | head -1
}

# resolve_modules fills order (the load order of the wanted modules and
# everything they depend on, built-in ones left out) and module_file
# (name -> file) for the kernel unpacked in $1. Names use underscores, as
# the kernel does.
declare -A module_file=() builtin=() visiting=() visited=()
order=()
resolve_modules() {
  local kdir=$1 f n
  while IFS= read -r f; do
    n=$(basename "$f")
    n=${n%%.ko*}
    module_file[${n//-/_}]=$f
  done < <(find "$kdir/lib/modules" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
  local b
  for b in "$kdir"/lib/modules/*/modules.builtin; do
    [ -f "$b" ] || continue
    while IFS= read -r f; do
      n=$(basename "$f")
      n=${n%%.ko*}
      builtin[${n//-/_}]=1
    done <"$b"
  done
  for n in "${modules[@]}"; do
    visit_module "$n"
  done
}

visit_module() {
  local m=${1//-/_}
  [ -z "${visited[$m]:-}" ] || return 0
  [ -z "${builtin[$m]:-}" ] || return 0
  [ -z "${visiting[$m]:-}" ] || die "module $m depends on itself"
  [ -n "${module_file[$m]:-}" ] || die "module $m is neither in the kernel package nor built in"
  visiting[$m]=1
  local deps d
  deps=$(modinfo_field "${module_file[$m]}" depends)
  for d in ${deps//,/ }; do
    visit_module "$d"
  done
  visited[$m]=1
  order+=("$m")
}

build_initrd() {
  local kdir=$1 out=$2
  local busybox
  busybox=$(command -v busybox || true)
  [ -n "$busybox" ] || die "busybox is missing: run hack/install-deps.sh (busybox-static)"
  if command -v ldd >/dev/null && ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked; install busybox-static"
  fi
  local work
  work=$(mktemp -d "$cache/initrd.XXXXXX")
  mkdir -p "$work"/{bin,dev,proc,sys,host,lib/modules,etc}
  cp "$busybox" "$work/bin/busybox"
  resolve_modules "$kdir"
  local m
  for m in "${order[@]}"; do
    decompress "${module_file[$m]}" >"$work/lib/modules/$m.ko" || die "cannot unpack module $m (${module_file[$m]})"
  done
  printf '%s\n' "${order[@]}" >"$work/lib/modules/order"
  cp "$root/hack/nvme-vm-init.sh" "$work/init"
  chmod +x "$work/init"
  (cd "$work" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$out.tmp"
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

prepare() {
  local pkg kdir vmlinuz stamp initrd
  pkg=$(kernel_package)
  kdir=$(unpack_kernel "$pkg")
  vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)
  [ -f "$vmlinuz" ] || die "no vmlinuz in $kdir/boot"
  # Rebuild when the kernel or the init script or this script changes.
  stamp=$( (echo "$pkg"; cat "$root/hack/nvme-vm-init.sh" "$0") | sha256sum | cut -c1-16)
  initrd=$cache/initrd-$stamp.gz
  if [ ! -f "$initrd" ]; then
    # Older initramfs of this kernel go; another kernel's stay (the tier
    # boots two kernels).
    local f
    for f in "$cache"/initrd-*.gz; do
      [ -e "$f" ] || continue
      if [ ! -f "$f.pkg" ] || [ "$(cat "$f.pkg")" = "$pkg" ]; then
        rm -f "$f" "$f.pkg"
      fi
    done
    build_initrd "$kdir" "$initrd"
    echo "$pkg" >"$initrd.pkg"
  fi
  echo "KERNEL_PACKAGE=$pkg"
  echo "KERNEL=$vmlinuz"
  echo "INITRD=$initrd"
  echo "KERNEL_NVME_AUTH=$(nvme_auth "$kdir")"
}

# nvme_auth prints 1 when the kernel in $1 was built with NVMe in-band
# authentication for both the host and the target, else 0: from 6.7
# CONFIG_NVME_HOST_AUTH, from 6.0 to 6.6 CONFIG_NVME_AUTH (which the host
# side then has), and CONFIG_NVME_TARGET_AUTH.
nvme_auth() {
  local config
  config=$(ls "$1"/boot/config-* 2>/dev/null | head -1)
  [ -n "$config" ] || die "no config file in $1/boot"
  local host=0 target=0
  if grep -q '^CONFIG_NVME_HOST_AUTH=y' "$config"; then
    host=1
  elif ! grep -q 'CONFIG_NVME_HOST_AUTH' "$config" && grep -Eq '^CONFIG_NVME_AUTH=[ym]' "$config"; then
    host=1
  fi
  grep -q '^CONFIG_NVME_TARGET_AUTH=y' "$config" && target=1
  if [ "$host$target" = 11 ]; then echo 1; else echo 0; fi
}

case "${1:-prepare}" in
  prepare) prepare ;;
  kernel-package) kernel_package ;;
  *) die "usage: $0 [prepare|kernel-package]" ;;
esac
