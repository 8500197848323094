#!/usr/bin/env bash
# Installs the host tools the node tests, benchmarks and demo run for real:
# mkfs.ext4/resize2fs (e2fsprogs), mkfs.xfs/xfs_growfs (xfsprogs), losetup,
# blkid and mount (util-linux, mount), and promtool (prometheus) for the
# alert tests, QEMU, busybox-static and fio for the NVMe/TCP VM tier
# (hack/nvme-vm.sh), shellcheck for the workflows' lint, and what the
# kubelet tier's nodes and its pause image need (util-linux, iproute2,
# gcc). Idempotent: a machine that has them
# all is left alone. Installing needs root and Debian's apt; without root
# it only says what is missing (the root-only tests then skip and say why).
set -euo pipefail

# tool -> Debian package
declare -A pkg=(
  [mkfs.ext4]=e2fsprogs [resize2fs]=e2fsprogs
  [mkfs.xfs]=xfsprogs [xfs_growfs]=xfsprogs
  [losetup]=util-linux [blkid]=util-linux [findmnt]=util-linux
  [mount]=mount
  # promtool evaluates the PrometheusRule alerts in go test ./manifests.
  [promtool]=prometheus
  # The NVMe/TCP VM tier (hack/nvme-vm.sh): QEMU, a static busybox for the
  # guest's initramfs, fio for the throughput benchmark. The kernel package
  # itself is downloaded into .cache/ by hack/nvme-vm.sh, never installed.
  [qemu-system-x86_64]=qemu-system-x86
  [busybox]=busybox-static
  # xz unpacks the kernel package's modules (6.12 ships them .ko.xz).
  [xz]=xz-utils
  [fio]=fio
  # docs/simulator.md's example, run as written by go test ./docs.
  [ssh]=openssh-client
  # make lint-workflows: actionlint checks the workflows' scripts with it.
  [shellcheck]=shellcheck
  # The kubelet tier (e2e/kubelet): each node's namespaces (unshare,
  # nsenter), its loopback addresses (ip), and the pause image's static
  # build from k8s.io/kubernetes' pause.c (gcc, libc's static archive).
  [unshare]=util-linux [nsenter]=util-linux
  [ip]=iproute2
  [gcc]=gcc
)
missing=()
for tool in "${!pkg[@]}"; do
  # sbin may be missing from a non-login PATH.
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
    missing+=("${pkg[$tool]}")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing ${missing[*]}; install them as root (the node tests skip without root)" >&2
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Packages that ship a service (prometheus) must not start it here: a
# policy-rc.d that refuses, for the length of the install only.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
