#!/usr/bin/env bash
# Builds the driver's container image without a container engine: the
# Dockerfile's image from Debian packages and the Go build, written as one
# OCI archive (OCI image layout + docker manifest.json) that `docker load`,
# `ctr images import` and `kind load image-archive` accept.
#
#   hack/build-image.sh [OUT]       default OUT: bin/rds-csi-driver-image.tar
#
# Environment: IMAGE (default ghcr.io/srvlab/rds-csi-driver:v0.1.0, the
# reference manifests/ and the chart use), VERSION (the driver's --version;
# default git describe), SOURCE_DATE_EPOCH (every timestamp; default the
# last commit's time, so a rebuild of a commit gives the same layer).
#
# The root filesystem: /rds-csi-driver (CGO_ENABLED=0), and the Debian
# bookworm packages of the node tools the driver runs (mkfs.ext4, fsck,
# resize2fs from e2fsprogs; mkfs.xfs, xfs_growfs from xfsprogs; blkid,
# blockdev, losetup from util-linux; mount, umount; modprobe from kmod) and
# nvme-cli for operators, with their dependencies as apt resolves them onto
# an empty system (dash and coreutils as the base; --no-install-recommends).
# Packages that serve only maintainer scripts or tools the driver never
# runs are declared present instead of installed (OMIT below). No
# maintainer script runs: packages are unpacked with dpkg-deb, /usr merged
# as Debian's own images are, /etc/passwd written here, and each package's
# control record kept in /var/lib/dpkg/status.d/ (as distroless images do,
# so image scanners see the packages). Downloads are cached in
# .cache/image/debs; the host's apt lists must be bookworm's (they are the
# machine's: this is a bookworm host); `apt-get update` runs if apt knows
# no package here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-bin/rds-csi-driver-image.tar}
[[ $OUT == /* ]] || OUT=$ROOT/$OUT
IMAGE=${IMAGE:-ghcr.io/srvlab/rds-csi-driver:v0.1.0}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
GO=${GO:-go}
CACHE=$ROOT/.cache/image
PACKAGES=(base-files dash coreutils e2fsprogs xfsprogs util-linux mount kmod nvme-cli)
# usrmerge: /usr is merged here by symlinks. python3: only xfs_scrub_all.
# perl, adduser, passwd, debconf, init-system-helpers, dpkg: maintainer
# scripts, which never run in the image.
OMIT=(usrmerge python3 python3-minimal python3.11 python3.11-minimal libpython3-stdlib
  perl perl-base adduser passwd debconf init-system-helpers dpkg)

[[ $(id -u) == 0 ]] || { echo "build-image.sh: needs root (apt's download cache and the root filesystem's owners)" >&2; exit 1; }
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[[ $codename == bookworm ]] || { echo "build-image.sh: the host's apt lists must be Debian bookworm's (this is ${codename:-not Debian})" >&2; exit 1; }
for t in apt-get apt-cache dpkg-deb tar; do command -v $t >/dev/null || { echo "build-image.sh: $t is missing" >&2; exit 1; }; done
if ! apt-cache show e2fsprogs >/dev/null 2>&1; then
  echo "build-image.sh: apt-get update (apt knows no packages yet)" >&2
  apt-get update -q >&2
fi

mkdir -p "$CACHE/debs/partial" "$(dirname "$OUT")"
start=$(date +%s)

# 1. The driver.
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $GO build -trimpath \
  -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/csi.Version=$VERSION" \
  -o "$CACHE/rds-csi-driver" ./cmd/rds-csi-driver

# 2. The packages: apt resolves them onto an empty system in which OMIT is
# declared installed (without dependencies, "Multi-Arch: allowed" so that
# python3:any is met), and downloads what is missing from the cache.
status=$CACHE/status
: >"$status"
for p in "${OMIT[@]}"; do
  v=$(apt-cache policy "$p" | awk '/Candidate:/{print $2}')
  [[ -n $v && $v != "(none)" ]] || { echo "build-image.sh: apt has no candidate for $p" >&2; exit 1; }
  printf 'Package: %s\nStatus: install ok installed\nVersion: %s\nArchitecture: amd64\nMulti-Arch: allowed\nMaintainer: none\nDescription: not in the image\n\n' "$p" "$v" >>"$status"
done
apt_opts=(-o "Dir::State::status=$status" -o "Dir::Cache::archives=$CACHE/debs" -o Debug::NoLocking=1
  -o APT::Install-Recommends=false -o APT::Get::Download-Only=true -q -y)
# The exact package set and versions, from apt's plan (the Inst lines of
# a simulation: "Inst NAME (VERSION ..."), then the download.
plan_and_download() {
  mapfile -t plan < <(apt-get "${apt_opts[@]}" -s install "${PACKAGES[@]}" |
    awk '$1=="Inst" {v=$3; gsub(/[()]/,"",v); print $2" "v}' | sort)
  [[ ${#plan[@]} -gt 0 ]] || { echo "build-image.sh: apt planned no packages" >&2; return 1; }
  apt-get "${apt_opts[@]}" install "${PACKAGES[@]}" >"$CACHE/apt.log" 2>&1
}
# Stale apt lists name versions the mirror no longer has (a security
# update replaced them): then update the lists once and plan again.
if ! plan_and_download; then
  echo "build-image.sh: download failed; apt-get update and once more" >&2
  apt-get update -q >&2
  plan_and_download || { cat "$CACHE/apt.log" >&2; exit 1; }
fi
debs=()
for entry in "${plan[@]}"; do
  name=${entry%% *}; name=${name%%:*}; v=${entry#* }
  # apt names the file NAME_VERSION_ARCH.deb, the epoch's colon as %3a.
  f=$(compgen -G "$CACHE/debs/${name}_${v/:/%3a}_*.deb" | head -1 || true)
  [[ -n $f ]] || { echo "build-image.sh: no downloaded .deb for $name $v in $CACHE/debs" >&2; exit 1; }
  debs+=("$f")
done

# 3. The root filesystem, merged /usr as in Debian's images.
rootfs=$CACHE/rootfs
rm -rf "$rootfs"
mkdir -p "$rootfs"/usr/{bin,sbin,lib,lib64} "$rootfs"/{etc,tmp,root,run,proc,sys,dev,var/lib/dpkg/status.d,home/nonroot}
for d in bin sbin lib lib64; do ln -s usr/$d "$rootfs/$d"; done
for d in "${debs[@]}"; do
  dpkg-deb --fsys-tarfile "$d" | tar -x --keep-directory-symlink -C "$rootfs"
  dpkg-deb -f "$d" >"$rootfs/var/lib/dpkg/status.d/$(dpkg-deb -f "$d" Package)"
done
rm -rf "$rootfs"/usr/share/{doc,man,info,lintian,locale}
chmod 1777 "$rootfs/tmp"
chmod 700 "$rootfs/root"
chown 65532:65532 "$rootfs/home/nonroot"
cat >"$rootfs/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/false
P
cat >"$rootfs/etc/group" <<'G'
root:x:0:
nogroup:x:65534:
nonroot:x:65532:
G
ln -sf ../proc/self/mounts "$rootfs/etc/mtab"
install -m 0755 "$CACHE/rds-csi-driver" "$rootfs/rds-csi-driver"

# 4. The archive.
comment="rds-csi-driver $VERSION; Debian bookworm: $(printf '%s ' "${PACKAGES[@]}")"
(cd hack/tools && $GO run ./cmd/oci-image --rootfs "$rootfs" --ref "$IMAGE" --out "$OUT" \
  --created "$SOURCE_DATE_EPOCH" --comment "$comment" \
  --label org.opencontainers.image.title=rds-csi-driver \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.source=https://github.com/srvlab/rds-csi)
echo "build-image.sh: $OUT: $IMAGE ($(du -h "$OUT" | cut -f1), ${#debs[@]} Debian packages, $(($(date +%s) - start)) s)" >&2
