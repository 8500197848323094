#!/usr/bin/env bash
# make release: everything a release publishes, from a clean tree, into
# DIST (default dist/, emptied first). docs/release.md lists the files and
# says how to verify them. Each is made from the commit alone: builds with
# -trimpath -buildvcs=false and the version as their only stamp, archives
# with the commit's time and root's owner, so two releases of one commit
# give the same binaries, archives, image archives and chart (the SBOMs
# carry their own creation time and document ID).
#
#   hack/release.sh [DIST]           the release
#   hack/release.sh --binaries DIR   only the release's binaries, by name:
#                                    kubectl-rds_OS_ARCH, rds-csi-driver_linux_ARCH
#
# Environment: VERSION (default hack/version.sh), IMAGE_REPO (default
# ghcr.io/srvlab/rds-csi-driver), RELEASE_ALLOW_DIRTY=1 (release a tree
# with changed or untracked files, under a version ending in -dirty),
# RDS_CSI_CACHE (the cache directory, default .cache: syft is built into
# its bin/). Needs root, as make image does.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GO=${GO:-go}
VERSION=${VERSION:-$(hack/version.sh)}
RELEASE=$(tr -d '[:space:]' <VERSION)
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/srvlab/rds-csi-driver}
CACHE=${RDS_CSI_CACHE:-$ROOT/.cache}
[[ $CACHE == /* ]] || CACHE=$ROOT/$CACHE
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH
# What Go reads from the environment (or go env -w) that changes the
# bytes, set to the release's: a rebuild from another shell is the same.
export GOFLAGS=-buildvcs=false GOAMD64=v1 GOARM64=v8.0
KREW_PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)
IMAGE_ARCHES=(amd64 arm64)

log() { echo "release: $*" >&2; }
die() { log "$*"; exit 1; }

# binaries DIR: every binary the release ships, with the release's flags.
binaries() {
  local dir=$1 p os arch
  mkdir -p "$dir"
  for p in "${KREW_PLATFORMS[@]}"; do
    os=${p%/*} arch=${p#*/}
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch $GO build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/version.Version=$VERSION" \
      -o "$dir/kubectl-rds_${os}_$arch" ./cmd/kubectl-rds
  done
  for arch in "${IMAGE_ARCHES[@]}"; do
    # The same command as hack/build-image.sh's (the image's driver).
    CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/srvlab/rds-csi/pkg/version.Version=$VERSION" \
      -o "$dir/rds-csi-driver_linux_$arch" ./cmd/rds-csi-driver
  done
}

if [[ ${1:-} == --binaries ]]; then
  [[ -n ${2:-} ]] || die "usage: hack/release.sh --binaries DIR"
  binaries "$2"
  exit 0
fi

DIST=${1:-dist}
[[ $DIST == /* ]] || DIST=$ROOT/$DIST
[[ $(id -u) == 0 ]] || die "needs root (the images: apt's download cache, the root filesystem's owners)"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [[ -z ${RELEASE_ALLOW_DIRTY:-} ]]; then
  # A changed or new file would be in the release and in no commit.
  changes=$(git status --porcelain --untracked-files=normal)
  [[ -z $changes ]] || die "the tree is not clean (commit, stash or remove; RELEASE_ALLOW_DIRTY=1 releases it anyway, as $VERSION):
$changes"
fi
case $VERSION in
  "$RELEASE") log "release $VERSION" ;;
  "$RELEASE"-*) log "a build after $RELEASE: $VERSION (not a release: docs/release.md)" ;;
  *) die "VERSION=$VERSION is not $RELEASE nor a build after it" ;;
esac
start=$(date +%s)
rm -rf "$DIST"
mkdir -p "$DIST"
work=$(mktemp -d "${TMPDIR:-/tmp}/rds-csi-release.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. The binaries, and kubectl-rds's archives (krew's format: the binary
# at the top). tar and gzip store no time but the commit's, no owner but
# root, no file name in the gzip header.
log "binaries"
binaries "$work/bin"
archive() { # archive OUT DIR FILE...
  local out=$1 dir=$2
  shift 2
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    --format=ustar -C "$dir" -cf - "$@" | gzip -9n >"$out"
}
for p in "${KREW_PLATFORMS[@]}"; do
  os=${p%/*} arch=${p#*/}
  d=$work/archive-${os}_$arch
  mkdir -p "$d"
  install -m 0755 "$work/bin/kubectl-rds_${os}_$arch" "$d/kubectl-rds"
  archive "$DIST/kubectl-rds_${os}_$arch.tar.gz" "$d" kubectl-rds
done

# 2. The driver's image, one archive per architecture (hack/build-image.sh;
# its driver is built by the same command as binaries' above).
for arch in "${IMAGE_ARCHES[@]}"; do
  log "image linux/$arch"
  IMAGE="$IMAGE_REPO:$VERSION" ARCH=$arch VERSION=$VERSION RDS_CSI_CACHE=$CACHE \
    hack/build-image.sh "$DIST/rds-csi-driver-image_linux_$arch.tar"
done

# 3. The chart, its version and appVersion this one.
log "chart"
chart=$(cd hack/tools && $GO run ./cmd/release chart --version "$VERSION" --out "$DIST" --mtime "$SOURCE_DATE_EPOCH" "$ROOT/charts/rds-csi")

# 4. The krew manifest, from the archives' sums.
(cd "$DIST" && sha256sum kubectl-rds_*.tar.gz >"$work/archives.sha256")
(cd hack/tools && $GO run ./cmd/release krew --version "$VERSION" --sums "$work/archives.sha256" "$ROOT/krew/rds.yaml") >"$DIST/rds.yaml"

# 5. The release notes: CHANGELOG.md's section of this release.
(cd hack/tools && $GO run ./cmd/release notes --version "$VERSION" --release "$RELEASE" "$ROOT/CHANGELOG.md") >"$DIST/RELEASE-NOTES.md"

# 6. SBOMs (SPDX JSON, by syft, pinned in hack/release-tools): each binary
# the release ships (kubectl-rds per platform, the image's driver per
# architecture) and each image (its Debian packages and the driver's Go
# modules).
syft_version=$(cd hack/release-tools && $GO list -m -f '{{.Version}}' github.com/anchore/syft)
syft=$CACHE/bin/syft-$syft_version
if [[ ! -x $syft ]]; then
  log "building syft $syft_version into $syft (once; minutes the first time)"
  mkdir -p "$CACHE/bin"
  (cd hack/release-tools && $GO build -o "$syft.tmp.$$" github.com/anchore/syft/cmd/syft)
  mv "$syft.tmp.$$" "$syft"
fi
export SYFT_CHECK_FOR_APP_UPDATE=false
sbom() { # sbom SOURCE OUT NAME
  "$syft" scan "$1" --quiet --source-name "$3" --source-version "$VERSION" -o "spdx-json=$2"
}
for f in "$work"/bin/*; do
  name=$(basename "$f")
  log "SBOM $name"
  sbom "file:$f" "$DIST/$name.spdx.json" "$name"
done
for arch in "${IMAGE_ARCHES[@]}"; do
  log "SBOM image linux/$arch"
  sbom "oci-archive:$DIST/rds-csi-driver-image_linux_$arch.tar" "$DIST/rds-csi-driver-image_linux_$arch.spdx.json" "$IMAGE_REPO"
done

# 7. The sums of everything.
(cd "$DIST" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
log "$VERSION in $DIST ($(($(date +%s) - start)) s):"
(cd "$DIST" && ls -l --time-style=+ | tail -n +2 | awk '{print "  " $5 "\t" $NF}') >&2
log "chart: $(basename "$chart"), image: $IMAGE_REPO:$VERSION"
