#!/usr/bin/env bash
# Build (or reuse) what the kubelet tier (make e2e-kubelet, e2e/kubelet)
# runs besides the control plane of hack/build-controlplane.sh: real nodes
# (kubelet, a container runtime, CNI) and the container images the chart
# and Kubernetes' storage e2e suite deploy, from Go modules and Debian
# packages only; nothing is installed on the host.
#
#   .cache/bin/kubelet-<v>, kube-scheduler-<v>, e2e.test-<v>   k8s.io/kubernetes@KUBE_VERSION
#   .cache/bin/ginkgo-<v>                          the ginkgo CLI (runs e2e.test's specs in parallel
#                                                  processes) at the version k8s.io/kubernetes@KUBE_VERSION
#                                                  pins: github.com/onsi/ginkgo/v2/ginkgo
#   .cache/bin/containerd-<v>, containerd-shim-runc-v2-<v>, ctr-<v>
#                                                  github.com/containerd/containerd/v2@CONTAINERD_VERSION
#   .cache/kubelet-tier/root/                      Debian's runc, containernetworking-plugins and
#                                                  busybox-static, unpacked (dpkg-deb -x), not installed
#   .cache/kubelet-tier/images/*.tar               OCI archives (hack/tools/cmd/oci-image), one image
#                                                  each, under the names the chart and the suite use
#   .cache/kubelet-tier/images/images.tsv          archive <TAB> image reference <TAB> what it holds
#
# The kube commands build in a copy of the control plane's wrapper module
# (.cache/build/kube-<v>-node/, the same go.mod and go.sum plus the
# kubelet's, the scheduler's and test/e2e's imports): with the same module
# versions, every package they share with kube-apiserver (client-go,
# apimachinery, k8s.io/api, kube's own API types ...) comes from Go's build
# cache. hack/build-controlplane.sh must have run first (make e2e-kubelet
# runs both).
#
# Environment (defaults in brackets):
#   RDS_CSI_CACHE        cache dir [<repo>/.cache]
#   KUBE_VERSION         [v1.36.3], as hack/build-controlplane.sh
#   CONTAINERD_VERSION   [v2.4.2]: Kubernetes 1.36 needs containerd 2.x; Debian bookworm has 1.6
#   ONLY                 space-separated subset of: kubelet kube-scheduler e2e.test ginkgo
#                        containerd debs images
#   REBUILD              1 rebuilds the binaries although present
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RDS_CSI_CACHE:-$ROOT/.cache}"
BIN="$CACHE/bin"
BUILD="$CACHE/build"
LOGDIR="$BUILD/logs"
TIER="$CACHE/kubelet-tier"
IMAGES="$TIER/images"
KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
ONLY="${ONLY:-}"
REBUILD="${REBUILD:-0}"
KUBE_DIR="$BUILD/kube-$KUBE_VERSION"
# The stand-ins' images (not upstream's: see build_images).
LAB_REGISTRY=localhost/rds-csi-lab
NODE_DIR="$BUILD/kube-$KUBE_VERSION-node"
CTRD_DIR="$BUILD/containerd-$CONTAINERD_VERSION"

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export CGO_ENABLED="${CGO_ENABLED:-0}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

START_TS=$(date +%s)
log() { printf '[build-kubelet-tier +%4ss] %s\n' "$(( $(date +%s) - START_TS ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
wanted() { [[ -z "$ONLY" || " $ONLY " == *" $1 "* ]]; }
have() { [[ -x "$1" && "$REBUILD" != 1 ]]; }

mkdir -p "$BIN" "$LOGDIR" "$IMAGES"
exec 9>"$BUILD/.lock-kubelet-tier"
if ! flock -n 9; then log "another build holds $BUILD/.lock-kubelet-tier, waiting"; flock 9; fi

# The same -X flags as hack/build-controlplane.sh (version, build date).
kube_ldflags() {
  local minor f="-s -w" date
  minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    f+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  echo "$f"
}

# What the node wrapper imports besides the control plane's tools.go: the
# two node commands, agnhost, and every package test/e2e's e2e_test.go
# imports (go test -c needs their modules in go.sum).
NODE_IMPORTS=(
  k8s.io/kubernetes/cmd/kubelet
  k8s.io/kubernetes/cmd/kube-scheduler
  k8s.io/kubernetes/test/images/agnhost
)
e2e_imports() {
  local src
  src=$(cd "$NODE_DIR" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/e2e/e2e_test.go
  awk '/^import \(/{i=1; next} i && /^\)/{exit} i' "$src" | grep -oE '"k8s\.io/kubernetes/[^"]+"' | tr -d '"'
}

prepare_node_wrapper() {
  [[ -f "$KUBE_DIR/.ready" ]] || die "no $KUBE_DIR/.ready: run hack/build-controlplane.sh first (make e2e-kubelet does)"
  local want
  want="$(cat "$KUBE_DIR/.ready"; printf '%s\n' "${NODE_IMPORTS[@]}" e2e)"
  [[ -f "$NODE_DIR/.ready" && "$(cat "$NODE_DIR/.ready")" == "$want" && "$NODE_DIR/go.mod" -nt "$KUBE_DIR/go.mod" ]] && return 0
  local t0=$(date +%s) lg="$LOGDIR/kube-$KUBE_VERSION-node-mod.log"
  log "kube: preparing the node wrapper module $NODE_DIR from $KUBE_DIR (log: $lg)"
  rm -rf "$NODE_DIR"; mkdir -p "$NODE_DIR"
  cp "$KUBE_DIR/go.mod" "$KUBE_DIR/go.sum" "$KUBE_DIR/tools.go" "$NODE_DIR/"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' "${NODE_IMPORTS[@]}"
    printf ')\n'
  } >"$NODE_DIR/tools_node.go"
  (cd "$NODE_DIR" && go mod tidy) >"$lg" 2>&1 || die "kube: go mod tidy of the node wrapper failed (see $lg)"
  local imports
  imports=$(e2e_imports) || die "kube: cannot read test/e2e/e2e_test.go's imports"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' $imports
    printf ')\n'
  } >"$NODE_DIR/tools_e2e.go"
  (cd "$NODE_DIR" && go mod tidy) >>"$lg" 2>&1 || die "kube: go mod tidy with test/e2e's imports failed (see $lg)"
  echo "$want" >"$NODE_DIR/.ready"
  log "kube: node wrapper ready in $(( $(date +%s) - t0 ))s"
}

build_in_node_wrapper() { # <name> build|test <package>
  local name=$1 verb=$2 pkg=$3
  local out="$BIN/$name-$KUBE_VERSION" t0=$(date +%s) lg="$LOGDIR/$name-$KUBE_VERSION.log"
  if have "$out"; then ln -sfn "$name-$KUBE_VERSION" "$BIN/$name"; log "$name: $out present"; return 0; fi
  prepare_node_wrapper
  local args=(build)
  [[ $verb == test ]] && args=(test -c)
  log "$name: go ${args[*]} $pkg (log: $lg)"
  if (cd "$NODE_DIR" && go "${args[@]}" -trimpath -ldflags="$(kube_ldflags)" -o "$out.tmp" "$pkg") >"$lg" 2>&1; then
    mv "$out.tmp" "$out"; ln -sfn "$name-$KUBE_VERSION" "$BIN/$name"
    log "$name: built in $(( $(date +%s) - t0 ))s"
  else
    rm -f "$out.tmp"; log "$name: build FAILED (see $lg):"; tail -5 "$lg" >&2; return 1
  fi
}

build_containerd() {
  local cmds=(containerd containerd-shim-runc-v2 ctr) c missing=0
  for c in "${cmds[@]}"; do have "$BIN/$c-$CONTAINERD_VERSION" || missing=1; done
  if [[ $missing == 0 ]]; then
    for c in "${cmds[@]}"; do ln -sfn "$c-$CONTAINERD_VERSION" "$BIN/$c"; done
    log "containerd: $CONTAINERD_VERSION present"; return 0
  fi
  local t0=$(date +%s) lg="$LOGDIR/containerd-$CONTAINERD_VERSION.log" mod=github.com/containerd/containerd/v2
  log "containerd: building $mod@$CONTAINERD_VERSION (${cmds[*]}) in $CTRD_DIR (log: $lg)"
  mkdir -p "$CTRD_DIR"
  # containerd's own go.mod has no replace directives: a wrapper that
  # requires it builds exactly its release's dependency versions.
  printf 'module rdscsi.local/containerd-build\n\ngo 1.26\n\nrequire %s %s\n' "$mod" "$CONTAINERD_VERSION" >"$CTRD_DIR/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in "${cmds[@]}"; do printf '\t_ "%s/cmd/%s"\n' "$mod" "$c"; done
    printf ')\n'
  } >"$CTRD_DIR/tools.go"
  # Snapshotters that need cgo or kernel features this tier does not use
  # are left out; overlayfs and native stay (containerd's build tags).
  local tags="no_btrfs no_devmapper no_zfs no_tracing"
  local ld="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=github.com/containerd/containerd/v2"
  : >"$lg"
  (cd "$CTRD_DIR" && go mod tidy) >>"$lg" 2>&1 || { log "containerd: go mod tidy failed (see $lg)"; return 1; }
  for c in "${cmds[@]}"; do
    if ! (cd "$CTRD_DIR" && go build -trimpath -tags "$tags" -ldflags "$ld" -o "$BIN/$c-$CONTAINERD_VERSION.tmp" "$mod/cmd/$c") >>"$lg" 2>&1; then
      rm -f "$BIN/$c-$CONTAINERD_VERSION.tmp"; log "containerd: $c FAILED (see $lg)"; tail -5 "$lg" >&2; return 1
    fi
    mv "$BIN/$c-$CONTAINERD_VERSION.tmp" "$BIN/$c-$CONTAINERD_VERSION"; ln -sfn "$c-$CONTAINERD_VERSION" "$BIN/$c"
  done
  log "containerd: built in $(( $(date +%s) - t0 ))s"
}

# Debian packages, downloaded into the cache and unpacked there: the OCI
# runtime, the CNI plugins (bridge, host-local, loopback) and busybox for
# the busybox and agnhost images.
DEBS=(runc containernetworking-plugins busybox-static)
unpack_debs() {
  local root="$TIER/root" stamp="$TIER/root/.debs"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "${DEBS[*]}" ]]; then log "debs: ${DEBS[*]} present"; return 0; fi
  local t0=$(date +%s) d="$TIER/debs" p f
  mkdir -p "$d"
  if [[ "$(apt-cache policy "${DEBS[0]}" 2>/dev/null)" != *"Candidate: "[0-9]* ]]; then
    log "debs: apt knows no ${DEBS[0]} yet, apt-get update"
    apt-get update -q >"$LOGDIR/kubelet-tier-apt-update.log" 2>&1 || true
  fi
  for p in "${DEBS[@]}"; do
    f=$(compgen -G "$d/${p}_*.deb" | head -1 || true)
    if [[ -z "$f" ]]; then
      (cd "$d" && apt-get download -q "$p") >>"$LOGDIR/kubelet-tier-debs.log" 2>&1 ||
        { apt-get update -q >>"$LOGDIR/kubelet-tier-debs.log" 2>&1; (cd "$d" && apt-get download -q "$p") >>"$LOGDIR/kubelet-tier-debs.log" 2>&1; } ||
        die "debs: apt-get download $p failed (see $LOGDIR/kubelet-tier-debs.log)"
    fi
  done
  rm -rf "$root"; mkdir -p "$root"
  for p in "${DEBS[@]}"; do dpkg-deb -x "$(compgen -G "$d/${p}_*.deb" | head -1)" "$root"; done
  echo "${DEBS[*]}" >"$stamp"
  log "debs: unpacked ${DEBS[*]} into $root in $(( $(date +%s) - t0 ))s"
}

OCI_IMAGE=""
oci_image() { # <out> <ref> <rootfs> <comment> [oci-image flags...]
  local out=$1 ref=$2 rootfs=$3 comment=$4; shift 4
  if [[ -z "$OCI_IMAGE" ]]; then
    OCI_IMAGE="$TIER/oci-image"
    (cd "$ROOT/hack/tools" && go build -o "$OCI_IMAGE" ./cmd/oci-image) || die "images: cannot build hack/tools/cmd/oci-image"
  fi
  "$OCI_IMAGE" --rootfs "$rootfs" --ref "$ref" --out "$out" --created 0 --comment "$comment" "$@"
  printf '%s\t%s\t%s\n' "$(basename "$out")" "$ref" "$comment" >>"$IMAGES/images.tsv.tmp"
}

# A root filesystem with static binaries and, optionally, busybox's applets
# as /bin/<applet> (what an alpine base gives agnhost).
new_rootfs() { # <dir> <with-busybox 0|1>
  local r=$1 a
  rm -rf "$r"; mkdir -p "$r"/{bin,etc,tmp,proc,sys,dev,var/run,root}
  chmod 1777 "$r/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
  if [[ $2 == 1 ]]; then
    install -m 0755 "$TIER/root/bin/busybox" "$r/bin/busybox"
    for a in $("$TIER/root/bin/busybox" --list); do [[ -e "$r/bin/$a" ]] || ln -s busybox "$r/bin/$a"; done
  fi
}

# The sidecars the chart deploys, with the versions of its values.yaml.
chart_image() { # <values key>
  awk -v k="$1:" '$1==k {f=1; next} f && $1=="image:" {print $2; exit}' "$ROOT/charts/rds-csi/values.yaml"
}

build_images() {
  local t0=$(date +%s) w="$TIER/rootfs"
  : >"$IMAGES/images.tsv.tmp"
  # The controller sidecars: the binaries hack/build-controlplane.sh built
  # from their modules, alone in the image as in the upstream ones
  # (distroless static, nonroot), under the chart's references.
  local key cmd ref
  for key in provisioner:csi-provisioner attacher:csi-attacher resizer:csi-resizer snapshotter:csi-snapshotter; do
    cmd=${key#*:}; ref=$(chart_image "${key%%:*}")
    [[ -n "$ref" ]] || die "images: no sidecars.${key%%:*}.image in charts/rds-csi/values.yaml"
    [[ -x "$BIN/$cmd" ]] || die "images: no $BIN/$cmd (hack/build-controlplane.sh builds it)"
    [[ "$ref" == *":$(basename "$(readlink "$BIN/$cmd")" | sed "s/^$cmd-//")" ]] ||
      die "images: the chart deploys $ref but $BIN/$cmd is $(readlink "$BIN/$cmd")"
    new_rootfs "$w" 0; install -m 0755 "$(readlink -f "$BIN/$cmd")" "$w/$cmd"
    oci_image "$IMAGES/$cmd.tar" "$ref" "$w" "$cmd from its Go module (hack/build-controlplane.sh)" --entrypoint "/$cmd" --user 65532:65532
  done
  # node-driver-registrar and livenessprobe: their modules are not served
  # by the Go module proxy, so the tier runs the project's own stand-ins
  # (hack/tools/cmd/lab-registrar, lab-livenessprobe) under names of their
  # own; the tests set the chart's sidecars.*.image to these.
  local lab
  for lab in lab-registrar:csi-node-driver-registrar lab-livenessprobe:livenessprobe; do
    new_rootfs "$w" 0
    (cd "$ROOT/hack/tools" && go build -trimpath -ldflags=-s -o "$w/${lab%%:*}" "./cmd/${lab%%:*}") ||
      die "images: hack/tools/cmd/${lab%%:*} did not build"
    oci_image "$IMAGES/${lab%%:*}.tar" "$LAB_REGISTRY/${lab#*:}:lab" "$w" \
      "hack/tools/cmd/${lab%%:*}: a stand-in for ${lab#*:}, whose module the Go module proxy does not serve" --entrypoint "/${lab%%:*}"
  done
  # busybox: Debian's busybox-static under the suite's name (registry.k8s.io/e2e-test-images/busybox).
  local bbv
  # Read busybox's whole banner before picking the version: `| head -1`
  # closed the pipe under it, and SIGPIPE failed the build (pipefail) on
  # a loaded machine.
  bbv=$("$TIER/root/bin/busybox" 2>&1 || true)
  bbv=$(awk 'NR == 1 {print $2}' <<<"$bbv")
  new_rootfs "$w" 1
  oci_image "$IMAGES/busybox.tar" "$(e2e_image BusyBox)" "$w" "Debian busybox-static $bbv" --entrypoint "" --cmd sh
  # The storage suite's exec spec (testsuites/volumes.go, testScriptInPod)
  # runs a script from the volume with /bin/sh in the nginx test image and
  # nothing of nginx: the same busybox root under that name.
  oci_image "$IMAGES/nginx-sh.tar" "$(e2e_image Nginx)" "$w" "Debian busybox-static $bbv: only /bin/sh of the suite's nginx image is used" --entrypoint "" --cmd sh
  # pause from k8s.io/kubernetes' build/pause/linux/pause.c, as upstream builds it (static).
  local ksrc pv
  ksrc=$(cd "$NODE_DIR" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  pv=$(e2e_image Pause); pv=${pv##*:}
  new_rootfs "$w" 0
  gcc -Os -Wall -Werror -static -DVERSION="v$pv" -o "$w/pause" "$ksrc/build/pause/linux/pause.c" 2>>"$LOGDIR/pause.log" ||
    die "images: gcc pause.c failed (see $LOGDIR/pause.log)"
  strip "$w/pause"
  oci_image "$IMAGES/pause.tar" "$(e2e_image Pause)" "$w" "pause.c of k8s.io/kubernetes@$KUBE_VERSION" --entrypoint /pause --user 65535:65535
  # agnhost from test/images/agnhost, over busybox (upstream: alpine).
  build_in_node_wrapper agnhost build k8s.io/kubernetes/test/images/agnhost || die "images: agnhost did not build"
  new_rootfs "$w" 1; mkdir -p "$w/uploads"
  install -m 0755 "$BIN/agnhost-$KUBE_VERSION" "$w/agnhost"; ln -s agnhost "$w/agnhost-2"
  oci_image "$IMAGES/agnhost.tar" "$(e2e_image Agnhost)" "$w" "test/images/agnhost of k8s.io/kubernetes@$KUBE_VERSION, busybox $bbv" --entrypoint /agnhost --cmd pause
  mv "$IMAGES/images.tsv.tmp" "$IMAGES/images.tsv"
  rm -rf "$w"
  log "images: $(wc -l <"$IMAGES/images.tsv") archives in $IMAGES in $(( $(date +%s) - t0 ))s"
}

# e2e_image <ID>: the reference test/utils/image gives an image of the
# suite (registry/name:version from its manifest.go).
e2e_image() {
  local ksrc
  ksrc=$(cd "$NODE_DIR" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  awk -v id="$1" '
    $0 ~ "configs\\[" id "\\] = Config\\{" {
      sub(/.*Config\{/, ""); sub(/\}.*/, ""); gsub(/[" ]/, ""); split($0, a, ",")
      reg = a[1]; sub(/^list\./, "", reg); print reg "\t" a[2] "\t" a[3]; exit }' \
    "$ksrc/test/utils/image/manifest.go" | while IFS=$'\t' read -r reg name ver; do
      case $reg in
        PromoterE2eRegistry) reg=registry.k8s.io/e2e-test-images ;;
        GcRegistry) reg=registry.k8s.io ;;
        *) die "images: unknown registry $reg for $1" ;;
      esac
      echo "$reg/$name:$ver"
    done
}

# lab-runc: runc with an OOM score the machine allows, for machines whose
# processes lack CAP_SYS_RESOURCE (hack/tools/cmd/lab-runc says why).
build_lab_runc() {
  mkdir -p "$TIER/bin"
  (cd "$ROOT/hack/tools" && go build -trimpath -ldflags=-s -o "$TIER/bin/lab-runc" ./cmd/lab-runc) ||
    { log "lab-runc: build FAILED"; return 1; }
  log "lab-runc: $TIER/bin/lab-runc"
}

rc=0
wanted debs           && { build_lab_runc || rc=1; }
wanted kubelet        && { build_in_node_wrapper kubelet build k8s.io/kubernetes/cmd/kubelet || rc=1; }
wanted kube-scheduler && { build_in_node_wrapper kube-scheduler build k8s.io/kubernetes/cmd/kube-scheduler || rc=1; }
wanted containerd     && { build_containerd || rc=1; }
wanted debs           && unpack_debs
wanted images         && build_images
wanted e2e.test       && { build_in_node_wrapper e2e.test test k8s.io/kubernetes/test/e2e || rc=1; }
# The ginkgo CLI is a module of the wrapper already (test/e2e's), so it
# builds from the same go.sum in seconds.
wanted ginkgo         && { build_in_node_wrapper ginkgo build github.com/onsi/ginkgo/v2/ginkgo || rc=1; }
log "done (rc=$rc)"
exit $rc
