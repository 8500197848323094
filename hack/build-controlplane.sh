#!/usr/bin/env bash
# Build (or reuse) the binaries of a real, kubelet-less Kubernetes control plane
# plus the kubernetes-csi sidecars, for the e2e tests and `make demo`.
#
# Everything lands in a git-ignored cache keyed by version:
#   .cache/bin/<name>-<version>        the binaries
#   .cache/bin/<name>                  symlink to the version in use
#   .cache/crds/external-snapshotter-<version>/*.yaml   VolumeSnapshot CRDs
#   .cache/build/                      wrapper modules, module copies, logs, status
# A second run finds everything and only prints the table.
#
# Environment knobs (defaults in brackets):
#   RDS_CSI_CACHE     cache dir [<repo>/.cache]
#   KUBE_VERSION      [v1.36.3]   (staging modules are taken at v0.<minor>.<patch>)
#   ETCD_SOURCE       source|apt  [source]: build etcd from Go modules, or Debian's etcd-server
#                     (bookworm's 3.4.23 lacks RequestWatchProgress, so kube-apiserver refuses
#                     watch-list over it and every informer falls back to one unpaginated LIST)
#   ETCD_VERSION      [v3.6.16]   only used with ETCD_SOURCE=source; the 3.6 line is what
#                     Kubernetes 1.36 is released with (~3 min cold on 2 cores, hack/README.md)
#   ATTACHER_VERSIONS, PROVISIONER_VERSIONS, RESIZER_VERSIONS, SNAPSHOTTER_VERSIONS
#                     space-separated candidates, first that builds wins
#   BUILD_KUBECTL     1|0 [1]
#   SHARED_SIDECARS   space-separated sidecars built in the kube wrapper module, on
#                     kube's dependency versions [attacher provisioner resizer snapshotter];
#                     "" builds every sidecar in its own module copy
#   RETRY_FAILED      1 to retry components recorded as failed (otherwise skipped)
#   REBUILD           1 to rebuild the wanted kube commands and sidecars although
#                     present (each binary is replaced atomically when its build is done)
#   ONLY              space-separated subset of: etcd kube-apiserver kube-controller-manager
#                     kubectl attacher provisioner resizer snapshotter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RDS_CSI_CACHE:-$ROOT/.cache}"
BIN="$CACHE/bin"
BUILD="$CACHE/build"
LOGDIR="$BUILD/logs"
STATUS="$BUILD/status.tsv"

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
ETCD_SOURCE="${ETCD_SOURCE:-source}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
ATTACHER_VERSIONS="${ATTACHER_VERSIONS:-v4.13.0}"
PROVISIONER_VERSIONS="${PROVISIONER_VERSIONS:-v6.3.0}"
RESIZER_VERSIONS="${RESIZER_VERSIONS:-v2.3.0 v2.2.0}"
SNAPSHOTTER_VERSIONS="${SNAPSHOTTER_VERSIONS:-v8.7.0 v8.6.0}"
BUILD_KUBECTL="${BUILD_KUBECTL:-1}"
SHARED_SIDECARS="${SHARED_SIDECARS-attacher provisioner resizer snapshotter}"
RETRY_FAILED="${RETRY_FAILED:-0}"
REBUILD="${REBUILD:-0}"
ONLY="${ONLY:-}"
ATTACHER_MOD=github.com/kubernetes-csi/external-attacher/v4;    ATTACHER_CMDS=csi-attacher
PROVISIONER_MOD=github.com/kubernetes-csi/external-provisioner/v6; PROVISIONER_CMDS=csi-provisioner
RESIZER_MOD=github.com/kubernetes-csi/external-resizer/v2;     RESIZER_CMDS=csi-resizer
SNAPSHOTTER_MOD=github.com/kubernetes-csi/external-snapshotter/v8; SNAPSHOTTER_CMDS="csi-snapshotter snapshot-controller"

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
export CGO_ENABLED="${CGO_ENABLED:-0}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

START_TS=$(date +%s)
log() { printf '[build-controlplane +%4ss] %s\n' "$(( $(date +%s) - START_TS ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$BIN" "$BUILD" "$LOGDIR"
touch "$STATUS"

# One build at a time per cache.
exec 9>"$BUILD/.lock"
if ! flock -n 9; then
  log "another build holds $BUILD/.lock, waiting"
  flock 9
fi

wanted() { [[ -z "$ONLY" || " $ONLY " == *" $1 "* ]]; }

# record <component> <version> <ok|failed|skipped> <seconds> <note>
record() {
  local tmp
  tmp=$(mktemp)
  awk -F'\t' -v c="$1" -v v="$2" '!($1==c && $2==v)' "$STATUS" >"$tmp" || true
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$tmp"
  mv "$tmp" "$STATUS"
}

# mod_download <module@version>: `go mod download -json` from a scratch module of
# our own, so the go command never looks at (or touches) the repository's go.mod.
mod_download() {
  local d="$BUILD/dl"
  if [[ ! -f "$d/go.mod" ]]; then
    mkdir -p "$d"
    printf 'module rdscsi.local/dl\n\ngo 1.24\n' >"$d/go.mod"
  fi
  (cd "$d" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$1")
}

failed_before() { [[ -f "$BUILD/failed/$1-$2" ]]; }
mark_failed() { mkdir -p "$BUILD/failed"; printf '%s\n' "$3" >"$BUILD/failed/$1-$2"; }
clear_failed() { rm -f "$BUILD/failed/$1-$2"; }

# link <name> <target-file-name>: unversioned convenience symlink in .cache/bin
link() { ln -sfn "$2" "$BIN/$1"; }

# Print the last error-ish lines of a log, one line, for the status table.
short_err() {
  grep -E 'error|cannot|undefined|not found|missing|Forbidden|no matching|invalid' "$1" 2>/dev/null \
    | grep -v '^#' | head -3 | tr '\n\t' '  ' | cut -c1-300 || true
}

############################################################################
# etcd
############################################################################
build_etcd() {
  if [[ "$ETCD_SOURCE" == apt ]]; then
    if [[ ! -x /usr/bin/etcd ]]; then
      # (no `apt-cache | grep -q`: under pipefail grep's early exit fails the pipe)
      if [[ "$(apt-cache policy etcd-server 2>/dev/null)" != *"Candidate: "[0-9]* ]]; then
        log "etcd: etcd-server not known to apt yet, running apt-get update"
        apt-get update >"$LOGDIR/apt-update.log" 2>&1 || true
      fi
      if [[ "$(apt-cache policy etcd-server 2>/dev/null)" == *"Candidate: "[0-9]* ]]; then
        local t0=$(date +%s)
        log "etcd: apt-get install -y etcd-server"
        if DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >"$LOGDIR/etcd-apt.log" 2>&1; then
          log "etcd: installed from Debian in $(( $(date +%s) - t0 ))s"
        else
          log "etcd: apt install failed (see $LOGDIR/etcd-apt.log), falling back to a source build"
          ETCD_SOURCE=source
        fi
      else
        log "etcd: no etcd-server in apt, falling back to a source build"
        ETCD_SOURCE=source
      fi
    fi
    if [[ "$ETCD_SOURCE" == apt ]]; then
      local v
      v=$(/usr/bin/etcd --version 2>/dev/null | awk '/etcd Version/{print "v"$3}')
      [[ -n "$v" ]] || die "etcd: /usr/bin/etcd gives no version"
      # No copy: Debian owns the file; the versioned name is a symlink to it.
      ln -sfn /usr/bin/etcd "$BIN/etcd-$v"
      link etcd "etcd-$v"
      record etcd "$v" ok 0 "Debian etcd-server (/usr/bin/etcd)"
      log "etcd: using Debian's /usr/bin/etcd $v"
      return 0
    fi
  fi

  local out="$BIN/etcd-$ETCD_VERSION"
  if [[ -x "$out" ]]; then link etcd "etcd-$ETCD_VERSION"; log "etcd: $out present"; return 0; fi
  if failed_before etcd "$ETCD_VERSION" && [[ "$RETRY_FAILED" != 1 ]]; then
    log "etcd: $ETCD_VERSION failed before, skipping (RETRY_FAILED=1 to retry)"; return 1
  fi
  local dir="$BUILD/etcd-$ETCD_VERSION" t0=$(date +%s) lg="$LOGDIR/etcd-$ETCD_VERSION.log"
  log "etcd: building go.etcd.io/etcd/server/v3@$ETCD_VERSION via wrapper module in $dir (log: $lg)"
  mkdir -p "$dir"
  # etcd's own main module replaces its sibling modules with local paths; in a
  # wrapper every go.etcd.io/etcd/* module is simply required at the same version.
  cat >"$dir/go.mod" <<EOF
module rdscsi.local/etcd-build

go 1.24

require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
EOF
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
  if (cd "$dir" && go mod tidy && go build -trimpath -ldflags="-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3) >"$lg" 2>&1; then
    mv "$out.tmp" "$out"; link etcd "etcd-$ETCD_VERSION"; clear_failed etcd "$ETCD_VERSION"
    record etcd "$ETCD_VERSION" ok "$(( $(date +%s) - t0 ))" "built from go.etcd.io/etcd/server/v3"
    log "etcd: built $out in $(( $(date +%s) - t0 ))s"
  else
    local e; e=$(short_err "$lg"); mark_failed etcd "$ETCD_VERSION" "$e"
    record etcd "$ETCD_VERSION" failed "$(( $(date +%s) - t0 ))" "$e"
    log "etcd: build FAILED: $e"; return 1
  fi
}

############################################################################
# Kubernetes: wrapper module around k8s.io/kubernetes
############################################################################
KUBE_DIR="$BUILD/kube-$KUBE_VERSION"

# The sidecars' modules and first candidates, "module version cmd..." a line, that
# the kube wrapper also requires (SHARED_SIDECARS).
shared_sidecar_modules() {
  local comp mod vs cmds
  for comp in $SHARED_SIDECARS; do
    case $comp in
      attacher)    mod=$ATTACHER_MOD;    vs=$ATTACHER_VERSIONS;    cmds=$ATTACHER_CMDS ;;
      provisioner) mod=$PROVISIONER_MOD; vs=$PROVISIONER_VERSIONS; cmds=$PROVISIONER_CMDS ;;
      resizer)     mod=$RESIZER_MOD;     vs=$RESIZER_VERSIONS;     cmds=$RESIZER_CMDS ;;
      snapshotter) mod=$SNAPSHOTTER_MOD; vs=$SNAPSHOTTER_VERSIONS; cmds=$SNAPSHOTTER_CMDS ;;
      *) continue ;;
    esac
    set -- $vs
    [[ -n "${1:-}" ]] && echo "$mod $1 $cmds"
  done
}

# The sidecars in the kube wrapper. Built from their own modules, the sidecars
# take the newer grpc, prometheus, x/net, otel ... that their go.mod files ask
# for, so every package they share with kube-apiserver compiles again for each
# of them (~4-6 min each on the 2-core machine). Here they are required by the
# kube wrapper too, and every module of kube's own build list is pinned to the
# version kube uses (replace M => M <kube's version>, and k8s.io/kubernetes
# itself, which csi-provisioner requires at another version): kube-apiserver
# compiles exactly the sources it did without the sidecars, and a sidecar
# built afterwards in the same module finds the shared packages in the Go
# build cache (content-addressed: same sources, flags and module version
# labels) and compiles only its own. KUBE_VERSION is chosen so that all four
# sidecars compile on its staging modules (client-go, api, apimachinery ... at
# v0.36.3 for v1.36.3, where they ask for v0.36.1-v0.37.1); the price is that
# they run on those and on kube's grpc, prometheus, x/net ..., older than the
# versions their release was tested with. The replaces also keep bin/ from
# sharing these packages with kube-apiserver (hack/README.md). A sidecar that does not compile on
# them falls back to its own module (build_sidecar_shared). With -trimpath the
# pinned modules' debug file paths, kube-apiserver's too, name the version the
# sidecars ask for (`go version -m` shows both: "M v_new => M v_kube").
add_shared_sidecars() { # <log>
  local lg=$1 want m v rv rmod rpath gomod
  want=$(shared_sidecar_modules)
  [[ -n "$want" ]] || return 0
  cp "$KUBE_DIR/go.mod" "$KUBE_DIR/go.mod.kube"; cp "$KUBE_DIR/go.sum" "$KUBE_DIR/go.sum.kube"
  cp "$KUBE_DIR/tools.go" "$KUBE_DIR/tools.go.kube"
  local args=(-replace="k8s.io/kubernetes=k8s.io/kubernetes@$KUBE_VERSION")
  # Every module of kube's build list that is not replaced already (the staging ones).
  while read -r m v rv; do
    [[ -n "$v" && -z "$rv" && "$m" != k8s.io/kubernetes ]] && args+=(-replace="$m=$m@$v")
  done < <(cd "$KUBE_DIR" && go list -m -f '{{if not .Main}}{{.Path}} {{.Version}} {{with .Replace}}{{.Path}}{{end}}{{end}}' all 2>>"$lg")
  local imports="" cmds c
  while read -r m v cmds; do
    args+=(-require="$m@$v")
    for c in $cmds; do imports+=$(printf '\t_ "%s/cmd/%s"' "$m" "$c")$'\n'; done
    gomod=$(mod_download "$m@$v" 2>>"$lg" | awk -F'"' '/"GoMod":/{print $4}') || true
    [[ -n "$gomod" && -f "$gomod" ]] || continue   # go mod tidy says why
    # A nested module the sidecar takes from a local path (external-snapshotter's
    # client/v8 => ./client) at the sidecar's version, when that exists.
    while read -r rmod rpath; do
      mod_download "$rmod@$v" >/dev/null 2>>"$lg" && args+=(-require="$rmod@$v")
    done < <(local_replaces "$gomod")
  done <<<"$want"
  { sed '/^)/d' "$KUBE_DIR/tools.go.kube"; printf '%s' "$imports"; echo ")"; } >"$KUBE_DIR/tools.go"
  echo "adding the sidecars: $(echo $want)" >>"$lg"
  if (cd "$KUBE_DIR" && go mod edit "${args[@]}" && go mod tidy) >>"$lg" 2>&1; then
    awk '{print $1, $2}' <<<"$want" >"$KUBE_DIR/sidecars"
    log "kube: the sidecars share the wrapper module ($(echo "$want" | awk '{printf "%s%s@%s", (NR>1?", ":""), $1, $2}' | sed 's#github.com/kubernetes-csi/##g'))"
  else
    log "kube: the sidecars do not fit in the wrapper module ($(short_err "$lg")); they build from their own modules"
    mv "$KUBE_DIR/go.mod.kube" "$KUBE_DIR/go.mod"; mv "$KUBE_DIR/go.sum.kube" "$KUBE_DIR/go.sum"
    mv "$KUBE_DIR/tools.go.kube" "$KUBE_DIR/tools.go"
  fi
  rm -f "$KUBE_DIR/go.mod.kube" "$KUBE_DIR/go.sum.kube" "$KUBE_DIR/tools.go.kube"
}

prepare_kube_wrapper() {
  # .ready holds the sidecars asked for when it was made: other ones, remake it.
  [[ -f "$KUBE_DIR/.ready" && "$(cat "$KUBE_DIR/.ready")" == "$(shared_sidecar_modules)" ]] && return 0
  rm -f "$KUBE_DIR/.ready" "$KUBE_DIR/sidecars"
  local t0=$(date +%s) lg="$LOGDIR/kube-$KUBE_VERSION-mod.log"
  log "kube: preparing wrapper module in $KUBE_DIR (log: $lg)"
  mkdir -p "$KUBE_DIR"
  local gomod
  gomod=$(mod_download "k8s.io/kubernetes@$KUBE_VERSION" \
          | awk -F'"' '/"GoMod":/{print $4}') || die "kube: cannot download k8s.io/kubernetes@$KUBE_VERSION"
  [[ -f "$gomod" ]] || die "kube: no go.mod for k8s.io/kubernetes@$KUBE_VERSION"
  local gover staging
  gover=$(awk '$1=="go"{print $2; exit}' "$gomod")
  # Every "k8s.io/X => ./staging/src/k8s.io/X" in upstream's replace block.
  staging=$(awk '$2=="=>" && $3 ~ /^\.\/staging\/src\// {print $1}' "$gomod" | sort -u)
  [[ -n "$staging" ]] || die "kube: found no staging replaces in $gomod"
  {
    echo "// Generated by hack/build-controlplane.sh; throwaway wrapper to build k8s.io/kubernetes commands."
    echo "module rdscsi.local/kube-build"
    echo
    echo "go $gover"
    echo
    # Same runtime defaults as upstream's own builds.
    grep -E '^godebug ' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"; done
    echo ")"
  } >"$KUBE_DIR/go.mod"
  cat >"$KUBE_DIR/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  log "kube: $(echo "$staging" | wc -l) staging modules replaced with $STAGING_VERSION; go mod tidy"
  if ! (cd "$KUBE_DIR" && go mod tidy) >"$lg" 2>&1; then
    die "kube: go mod tidy failed: $(short_err "$lg")"
  fi
  add_shared_sidecars "$lg"
  shared_sidecar_modules >"$KUBE_DIR/.ready"
  log "kube: wrapper module ready in $(( $(date +%s) - t0 ))s"
}

kube_ldflags() {
  local minor patch date
  minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local f="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    f+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  echo "$f"
}

build_kube_cmd() { # <cmd>
  local cmd=$1 out="$BIN/$1-$KUBE_VERSION"
  if [[ -x "$out" && "$REBUILD" != 1 ]]; then link "$cmd" "$cmd-$KUBE_VERSION"; log "$cmd: $out present"; return 0; fi
  if failed_before "$cmd" "$KUBE_VERSION" && [[ "$RETRY_FAILED" != 1 ]]; then
    log "$cmd: $KUBE_VERSION failed before, skipping (RETRY_FAILED=1 to retry)"; return 1
  fi
  prepare_kube_wrapper
  local t0=$(date +%s) lg="$LOGDIR/$cmd-$KUBE_VERSION.log"
  log "$cmd: go build k8s.io/kubernetes/cmd/$cmd (log: $lg)"
  if (cd "$KUBE_DIR" && go build -trimpath -ldflags="$(kube_ldflags)" -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd") >"$lg" 2>&1; then
    mv "$out.tmp" "$out"; link "$cmd" "$cmd-$KUBE_VERSION"; clear_failed "$cmd" "$KUBE_VERSION"
    record "$cmd" "$KUBE_VERSION" ok "$(( $(date +%s) - t0 ))" "k8s.io/kubernetes/cmd/$cmd"
    log "$cmd: built in $(( $(date +%s) - t0 ))s"
  else
    rm -f "$out.tmp"
    local e; e=$(short_err "$lg"); mark_failed "$cmd" "$KUBE_VERSION" "$e"
    record "$cmd" "$KUBE_VERSION" failed "$(( $(date +%s) - t0 ))" "$e"
    log "$cmd: build FAILED: $e"; return 1
  fi
}

############################################################################
# kubernetes-csi sidecars, built inside a writable copy of their module
############################################################################
# build_sidecar <component> <module> "<versions>" "<cmd dirs>" [crd-subdir]
build_sidecar() {
  local comp=$1 mod=$2 versions=$3 cmds=$4 v
  # Already have one? (first candidate in order whose binaries all exist)
  [[ "$REBUILD" == 1 ]] || for v in $versions; do
    local have=1 c
    for c in $cmds; do [[ -x "$BIN/$c-$v" ]] || have=0; done
    if [[ $have == 1 ]] && { [[ "$comp" != snapshotter ]] || [[ -d "$CACHE/crds/external-snapshotter-$v" ]]; }; then
      for c in $cmds; do link "$c" "$c-$v"; done
      [[ "$comp" == snapshotter ]] && ln -sfn "external-snapshotter-$v" "$CACHE/crds/external-snapshotter"
      log "$comp: $v present"
      return 0
    fi
  done
  for v in $versions; do
    if failed_before "$comp" "$v" && [[ "$RETRY_FAILED" != 1 ]]; then
      log "$comp: $v failed before ($(cat "$BUILD/failed/$comp-$v")), skipping (RETRY_FAILED=1 to retry)"
      continue
    fi
    if [[ " $SHARED_SIDECARS " == *" $comp "* ]] && build_sidecar_shared "$comp" "$mod" "$v" "$cmds"; then return 0; fi
    if build_sidecar_version "$comp" "$mod" "$v" "$cmds"; then return 0; fi
  done
  log "$comp: no candidate version built ($versions)"
  return 1
}

# copy_snapshot_crds <version> <module copy or ""> <log>: the VolumeSnapshot
# CRDs live in the client/v8 submodule (a separate module zip), or in the main
# one for older layouts.
copy_snapshot_crds() {
  local v=$1 src=$2 lg=$3 crddir=""
  [[ -n "$src" ]] && crddir="$src/client/config/crd"
  if [[ -z "$crddir" || ! -d "$crddir" ]]; then
    local major=${v%%.*} cdir
    cdir=$(mod_download "github.com/kubernetes-csi/external-snapshotter/client/$major@$v" 2>>"$lg" | awk -F'"' '/"Dir":/{print $4}') || true
    [[ -n "$cdir" ]] && crddir="$cdir/config/crd"
  fi
  if ls "$crddir"/*.yaml >/dev/null 2>&1; then
    local dst="$CACHE/crds/external-snapshotter-$v"
    rm -rf "$dst.tmp"; mkdir -p "$dst.tmp"
    cp "$crddir"/*.yaml "$dst.tmp/"; chmod u+w "$dst.tmp"/*
    rm -rf "$dst"; mv "$dst.tmp" "$dst"
    ln -sfn "external-snapshotter-$v" "$CACHE/crds/external-snapshotter"
    echo "copied CRDs from $crddir" >>"$lg"
  else
    echo "no CRD yaml found under $crddir" >>"$lg"; return 1
  fi
}

# Local-path replaces ("M ./path") in a go.mod given as a file.
local_replaces() {
  go mod edit -json "$1" | awk -F'"' '
      /"Old":/ {inold=1} /"New":/ {inold=0; innew=1}
      inold && /"Path":/ {old=$4}
      innew && /"Path":/ {if ($4 ~ /^\.\.?\//) print old, $4; innew=0}'
}

# build_sidecar_shared <component> <module> <version> <cmds>: build the
# sidecar in the kube wrapper module, when prepare_kube_wrapper put it there
# (see there for why). 1 when it is not there or does not build: the caller
# then builds the sidecar's own module, and later runs skip this attempt
# (RETRY_FAILED=1 retries).
build_sidecar_shared() {
  local comp=$1 mod=$2 v=$3 cmds=$4 c
  if failed_before "$comp" "$v-shared" && [[ "$RETRY_FAILED" != 1 ]]; then
    log "$comp: $v did not build in the kube wrapper before, using its own module (RETRY_FAILED=1 retries)"
    return 1
  fi
  if ! (prepare_kube_wrapper); then
    log "$comp: no kube wrapper module, using its own module"; return 1
  fi
  grep -qx "$mod $v" "$KUBE_DIR/sidecars" 2>/dev/null || return 1
  local t0=$(date +%s) lg="$LOGDIR/$comp-$v.log"
  log "$comp: building $mod@$v ($cmds) in the kube wrapper module, on kube $KUBE_VERSION's dependency versions (log: $lg)"
  : >"$lg"
  local ok=1
  for c in $cmds; do
    echo "=== go build $mod/cmd/$c (in $KUBE_DIR)" >>"$lg"
    if (cd "$KUBE_DIR" && go build -trimpath -ldflags="-s -w -X main.version=$v" -o "$BIN/$c-$v.tmp" "$mod/cmd/$c") >>"$lg" 2>&1; then
      mv "$BIN/$c-$v.tmp" "$BIN/$c-$v"
    else
      rm -f "$BIN/$c-$v.tmp"; ok=0; break
    fi
  done
  if [[ $ok == 1 && "$comp" == snapshotter ]]; then
    copy_snapshot_crds "$v" "" "$lg" || ok=0
  fi
  if [[ $ok == 1 ]]; then
    for c in $cmds; do link "$c" "$c-$v"; done
    clear_failed "$comp" "$v"; clear_failed "$comp" "$v-shared"
    record "$comp" "$v" ok "$(( $(date +%s) - t0 ))" "$mod ($cmds) in the kube wrapper, on kube $KUBE_VERSION's dependency versions"
    log "$comp: $v built in the kube wrapper in $(( $(date +%s) - t0 ))s"
    return 0
  fi
  local e; e=$(short_err "$lg"); [[ -n "$e" ]] || e="see $lg"
  mark_failed "$comp" "$v-shared" "$e"
  mv "$lg" "$LOGDIR/$comp-$v-shared.log"
  log "$comp: $v does not build on kube's dependency versions ($e; log: $LOGDIR/$comp-$v-shared.log); building its own module"
  return 1
}

build_sidecar_version() { # <component> <module> <version> <cmds>
  local comp=$1 mod=$2 v=$3 cmds=$4 c
  local t0=$(date +%s) lg="$LOGDIR/$comp-$v.log" src="$BUILD/$comp-$v"
  log "$comp: building $mod@$v ($cmds) (log: $lg)"
  : >"$lg"
  local dir
  dir=$(mod_download "$mod@$v" 2>>"$lg" | awk -F'"' '/"Dir":/{print $4}') || true
  if [[ -z "$dir" || ! -d "$dir" ]]; then
    local e="go mod download $mod@$v failed: $(short_err "$lg")"
    mark_failed "$comp" "$v" "$e"; record "$comp" "$v" failed "$(( $(date +%s) - t0 ))" "$e"
    log "$comp: $e"; return 1
  fi
  rm -rf "$src"; cp -r "$dir" "$src"; chmod -R u+w "$src"
  # Module zips drop vendored packages but keep vendor/modules.txt, which would
  # switch the go command to -mod=vendor: build from the module graph instead.
  rm -rf "$src/vendor"
  # Nested modules replaced by a local path (external-snapshotter's
  # "client/v8 => ./client") are not in the module zip: fetch that module at
  # the same version into the path, or else use the version go.mod requires.
  local rmod rpath rdir
  while read -r rmod rpath; do
    [[ -e "$src/$rpath" ]] && continue
    rdir=$(mod_download "$rmod@$v" 2>>"$lg" | awk -F'"' '/"Dir":/{print $4}') || true
    if [[ -n "$rdir" && -d "$rdir" ]]; then
      echo "replace $rmod => $rpath: copied $rmod@$v" >>"$lg"
      mkdir -p "$(dirname "$src/$rpath")"; cp -r "$rdir" "$src/$rpath"; chmod -R u+w "$src/$rpath"
    else
      echo "replace $rmod => $rpath: $rmod@$v not available, dropping the replace" >>"$lg"
      (cd "$src" && go mod edit -dropreplace="$rmod") >>"$lg" 2>&1
    fi
  done < <(local_replaces "$src/go.mod")
  local ok=1
  for c in $cmds; do
    echo "=== go build ./cmd/$c" >>"$lg"
    if (cd "$src" && go build -mod=mod -trimpath -ldflags="-s -w -X main.version=$v" -o "$BIN/$c-$v.tmp" "./cmd/$c") >>"$lg" 2>&1; then
      mv "$BIN/$c-$v.tmp" "$BIN/$c-$v"
    else
      rm -f "$BIN/$c-$v.tmp"; ok=0; break
    fi
  done
  if [[ $ok == 1 && "$comp" == snapshotter ]]; then
    copy_snapshot_crds "$v" "$src" "$lg" || ok=0
  fi
  if [[ $ok == 1 ]]; then
    for c in $cmds; do link "$c" "$c-$v"; done
    clear_failed "$comp" "$v"
    record "$comp" "$v" ok "$(( $(date +%s) - t0 ))" "$mod ($cmds)"
    log "$comp: $v built in $(( $(date +%s) - t0 ))s"
    rm -rf "$src"
    return 0
  fi
  local e; e=$(short_err "$lg"); [[ -n "$e" ]] || e="see $lg"
  mark_failed "$comp" "$v" "$e"; record "$comp" "$v" failed "$(( $(date +%s) - t0 ))" "$e"
  log "$comp: $v FAILED: $e"
  return 1
}

############################################################################
rc=0
wanted etcd && { build_etcd || rc=1; }
for cmd in kube-apiserver kube-controller-manager; do
  wanted "$cmd" && { build_kube_cmd "$cmd" || rc=1; }
done
if [[ "$BUILD_KUBECTL" == 1 ]] && wanted kubectl; then
  build_kube_cmd kubectl || log "kubectl: optional, continuing"
fi
wanted attacher    && { build_sidecar attacher    "$ATTACHER_MOD"    "$ATTACHER_VERSIONS"    "$ATTACHER_CMDS" || rc=1; }
wanted provisioner && { build_sidecar provisioner "$PROVISIONER_MOD" "$PROVISIONER_VERSIONS" "$PROVISIONER_CMDS" || rc=1; }
# Resizer and snapshotter are optional: the scenarios that need them skip
# when they did not build, so their failure does not fail the script.
wanted resizer     && { build_sidecar resizer     "$RESIZER_MOD"     "$RESIZER_VERSIONS"     "$RESIZER_CMDS" || log "resizer: optional, continuing"; }
wanted snapshotter && { build_sidecar snapshotter "$SNAPSHOTTER_MOD" "$SNAPSHOTTER_VERSIONS" "$SNAPSHOTTER_CMDS" || log "snapshotter: optional, continuing"; }

# Final table.
{
  echo
  printf '%-26s %-10s %8s  %s\n' BINARY VERSION SIZE TARGET
  for l in "$BIN"/*; do
    [[ -L "$l" ]] || continue
    name=$(basename "$l")
    [[ "$name" == *-v[0-9]* ]] && continue   # the versioned names are listed via their link
    t=$(readlink "$l"); f=$(readlink -f "$l")
    [[ -e "$f" ]] || continue
    printf '%-26s %-10s %7sM  %s\n' "$name" "${t##*-}" "$(( $(stat -c %s "$f") / 1048576 ))" "$f"
  done
  if [[ -d "$CACHE/crds/external-snapshotter" ]]; then
    printf '%-26s %-10s %8s  %s\n' "snapshot CRDs" "$(readlink "$CACHE/crds/external-snapshotter" | sed 's/.*-//')" \
      "$(ls "$CACHE/crds/external-snapshotter/" | wc -l) files" "$(readlink -f "$CACHE/crds/external-snapshotter")"
  fi
  echo
  echo "build record ($STATUS): component version result seconds note"
  column -t -s $'\t' "$STATUS" 2>/dev/null || cat "$STATUS"
} >&2
log "done (rc=$rc)"
exit $rc
