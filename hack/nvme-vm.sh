#!/usr/bin/env bash
# Prepares what the NVMe/TCP VM tier boots (e2e/vm, e2e/nvme): a Debian
# kernel and a busybox initramfs carrying the modules for the nvmet target,
# the nvme-tcp initiator, ext4, xfs, loop, 9p and overlay.
#
#   hack/nvme-vm.sh prepare   download/unpack/build what is missing; prints
#                             KERNEL=... and INITRD=... (the default)
#
# The kernel package is fetched with `apt-get download` and unpacked with
# `dpkg-deb -x` into .cache/nvme-vm/: nothing is installed, nothing goes
# into /boot and no initramfs hook runs. The initramfs is rebuilt only when
# the kernel or this script changes. Tools (qemu-system-x86, busybox-static)
# come from hack/install-deps.sh. Facts behind the choices:
# ../shared/NVME-VM.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NVME_VM_CACHE:-$root/.cache/nvme-vm}
mkdir -p "$cache"

# The module load order: each module after the ones its .modinfo depends=
# names (the package ships no modules.dep). virtio_mmio is for -M microvm.
modules=(
  configfs crct10dif_common crc_t10dif crc64 crc64_rocksoft t10_pi
  nvme_core nvme_fabrics nvme_tcp nvmet nvmet_tcp
  crc32c_generic jbd2 mbcache crc16 ext4 libcrc32c xfs loop
  virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci virtio_mmio
  9pnet 9pnet_virtio netfs fscache 9p overlay
)

die() { echo "nvme-vm: $*" >&2; exit 1; }

kernel_package() {
  if [ -n "${NVME_VM_KERNEL_PACKAGE:-}" ]; then
    echo "$NVME_VM_KERNEL_PACKAGE"
    return
  fi
  # The current ABI is what the meta package depends on.
  local p
  p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$p" ]; then
    [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 || true
    p=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  [ -n "$p" ] || die "apt-cache knows no linux-image-amd64; run apt-get update (Debian only)"
  echo "$p"
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
  local m f order=()
  for m in "${modules[@]}"; do
    f=$(find "$kdir/lib/modules" -name "$m.ko" -o -name "${m//_/-}.ko" | head -1)
    [ -n "$f" ] || die "module $m not found in $kdir"
    cp "$f" "$work/lib/modules/$m.ko"
    order+=("$m")
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
    rm -f "$cache"/initrd-*.gz
    build_initrd "$kdir" "$initrd"
  fi
  echo "KERNEL=$vmlinuz"
  echo "INITRD=$initrd"
}

case "${1:-prepare}" in
  prepare) prepare ;;
  *) die "usage: $0 [prepare]" ;;
esac
