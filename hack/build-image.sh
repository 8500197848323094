#!/usr/bin/env bash
# Builds the driver's container image without a container engine: the
# Dockerfile's image from Debian packages and the Go build, written as one
# OCI archive (OCI image layout + docker manifest.json) that `docker load`,
# `ctr images import` and `kind load image-archive` accept.
#
#   hack/build-image.sh [OUT]       default OUT: bin/rds-csi-driver-image.tar
#
# Environment: VERSION (the driver's --version and the image's tag;
# default hack/version.sh), IMAGE (default
# ghcr.io/srvlab/rds-csi-driver:$VERSION), ARCH (amd64, the default, or
# arm64: the Go build and the Debian packages of that architecture; the
# packages are only unpacked, with dpkg-deb, and nothing of the image runs
# here, so an arm64 image needs no emulator), SOURCE_DATE_EPOCH (every
# timestamp; default the last commit's time, so a rebuild of a commit
# gives the same layer).
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
# so image scanners see the packages). apt reads the host's sources (this
# is a bookworm host) into package lists of the image's architecture of
# its own, .cache/image/<arch>/lists, fetched the first time and again
# when a download fails (the host's lists and dpkg are not touched);
# downloads are cached in .cache/image/debs (RDS_CSI_CACHE moves .cache).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-bin/rds-csi-driver-image.tar}
[[ $OUT == /* ]] || OUT=$ROOT/$OUT
VERSION=${VERSION:-$(hack/version.sh)}
IMAGE=${IMAGE:-ghcr.io/srvlab/rds-csi-driver:$VERSION}
ARCH=${ARCH:-amd64}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
GO=${GO:-go}
CACHE=${RDS_CSI_CACHE:-$ROOT/.cache}
[[ $CACHE == /* ]] || CACHE=$ROOT/$CACHE
CACHE=$CACHE/image
PACKAGES=(base-files dash coreutils e2fsprogs xfsprogs util-linux mount kmod nvme-cli)
# usrmerge: /usr is merged here by symlinks. python3: only xfs_scrub_all.
# perl, adduser, passwd, debconf, init-system-helpers, dpkg: maintainer
# scripts, which never run in the image.
OMIT=(usrmerge python3 python3-minimal python3.11 python3.11-minimal libpython3-stdlib
  perl perl-base adduser passwd debconf init-system-helpers dpkg)

[[ $(id -u) == 0 ]] || { echo "build-image.sh: needs root (apt's download cache and the root filesystem's owners)" >&2; exit 1; }
case $ARCH in amd64 | arm64) ;; *) echo "build-image.sh: ARCH=$ARCH; amd64 or arm64" >&2; exit 1 ;; esac
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[[ $codename == bookworm ]] || { echo "build-image.sh: the host's apt sources must be Debian bookworm's (this is ${codename:-not Debian})" >&2; exit 1; }
for t in apt-get apt-cache dpkg-deb tar; do command -v $t >/dev/null || { echo "build-image.sh: $t is missing" >&2; exit 1; }; done

ARCHDIR=$CACHE/$ARCH
mkdir -p "$CACHE/debs/partial" "$ARCHDIR/lists/partial" "$(dirname "$OUT")"
# One build of an architecture at a time per cache (its root filesystem
# and lists are shared): a second waits here.
exec 9>"$ARCHDIR/.lock"
flock 9
start=$(date +%s)
# apt of the image's architecture: package lists of its own, no package
# cache file, no lock on the host's dpkg; the installed set is $status.
arch_opts=(-o "APT::Architecture=$ARCH" -o "APT::Architectures::=$ARCH" -o "Dir::State::Lists=$ARCHDIR/lists"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o Debug::NoLocking=1)
: >"$ARCHDIR/nothing-installed"
none=(-o "Dir::State::status=$ARCHDIR/nothing-installed")
update_lists() {
  echo "build-image.sh: apt-get update: the $ARCH package lists of the host's sources, into $ARCHDIR/lists" >&2
  apt-get "${arch_opts[@]}" "${none[@]}" -q update >&2
}
apt-cache "${arch_opts[@]}" "${none[@]}" show e2fsprogs >/dev/null 2>&1 || update_lists

# 1. The driver, with the release's flags (docs/release.md).
CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH $GO build -trimpath -buildvcs=false \
  -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/version.Version=$VERSION" \
  -o "$ARCHDIR/rds-csi-driver" ./cmd/rds-csi-driver

# 2. The packages: apt resolves them onto an empty system in which OMIT is
# declared installed (without dependencies, "Multi-Arch: allowed" so that
# python3:any is met), and downloads what is missing from the cache.
status=$ARCHDIR/status
write_status() {
  : >"$status"
  local p v
  for p in "${OMIT[@]}"; do
    v=$(apt-cache "${arch_opts[@]}" "${none[@]}" policy "$p" | awk '/Candidate:/{print $2}')
    [[ -n $v && $v != "(none)" ]] || { echo "build-image.sh: apt has no $ARCH candidate for $p" >&2; return 1; }
    printf 'Package: %s\nStatus: install ok installed\nVersion: %s\nArchitecture: %s\nMulti-Arch: allowed\nMaintainer: none\nDescription: not in the image\n\n' "$p" "$v" "$ARCH" >>"$status"
  done
}
apt_opts=("${arch_opts[@]}" -o "Dir::State::status=$status" -o "Dir::Cache::archives=$CACHE/debs"
  -o APT::Install-Recommends=false -o APT::Get::Download-Only=true -q -y)
# The exact package set and versions, from apt's plan (the Inst lines of
# a simulation: "Inst NAME (VERSION ..."), then the download.
plan_and_download() {
  write_status || return 1
  mapfile -t plan < <(apt-get "${apt_opts[@]}" -s install "${PACKAGES[@]}" |
    awk '$1=="Inst" {v=$3; gsub(/[()]/,"",v); print $2" "v}' | sort)
  [[ ${#plan[@]} -gt 0 ]] || { echo "build-image.sh: apt planned no packages" >&2; return 1; }
  apt-get "${apt_opts[@]}" install "${PACKAGES[@]}" >"$ARCHDIR/apt.log" 2>&1
}
# Stale lists name versions the mirror no longer has (a security update
# replaced them): then update the lists once and plan again.
if ! plan_and_download; then
  echo "build-image.sh: download failed; apt-get update and once more" >&2
  update_lists
  plan_and_download || { cat "$ARCHDIR/apt.log" >&2; exit 1; }
fi
debs=()
for entry in "${plan[@]}"; do
  name=${entry%% *}; name=${name%%:*}; v=${entry#* }
  # apt names the file NAME_VERSION_ARCH.deb (ARCH all for data-only
  # packages), the epoch's colon as %3a.
  f=""
  for a in "$ARCH" all; do
    [[ -e "$CACHE/debs/${name}_${v/:/%3a}_$a.deb" ]] && { f="$CACHE/debs/${name}_${v/:/%3a}_$a.deb"; break; }
  done
  [[ -n $f ]] || { echo "build-image.sh: no downloaded .deb for $name $v ($ARCH) in $CACHE/debs" >&2; exit 1; }
  debs+=("$f")
done

# 3. The root filesystem, merged /usr as in Debian's images.
rootfs=$ARCHDIR/rootfs
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
install -m 0755 "$ARCHDIR/rds-csi-driver" "$rootfs/rds-csi-driver"

# 4. The archive.
comment="rds-csi-driver $VERSION linux/$ARCH; Debian bookworm: $(printf '%s ' "${PACKAGES[@]}")"
(cd hack/tools && $GO run ./cmd/oci-image --rootfs "$rootfs" --ref "$IMAGE" --arch "$ARCH" --out "$OUT" \
  --created "$SOURCE_DATE_EPOCH" --comment "$comment" \
  --label org.opencontainers.image.title=rds-csi-driver \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.source=https://github.com/srvlab/rds-csi)
echo "build-image.sh: $OUT: $IMAGE linux/$ARCH ($(du -h "$OUT" | cut -f1), ${#debs[@]} Debian packages, $(($(date +%s) - start)) s)" >&2
