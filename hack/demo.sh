#!/usr/bin/env bash
# make demo: the driver on a real, kubelet-less control plane. Builds what is
# missing of what the demo runs (hack/build-controlplane.sh: etcd,
# kube-apiserver, kube-controller-manager, csi-attacher, csi-provisioner,
# csi-snapshotter; not kubectl or csi-resizer) in the background while bin/
# (`make build`) and the demo program compile, then runs e2e/cmd/demo, which
# starts the control plane, the RDS simulator and the driver with its
# sidecars (as the e2e suite does) and walks a volume through provision ->
# attach -> node failure -> fenced handoff -> snapshot -> unattended
# failover -> cleanup.
# Arguments go to the demo program (-v: every timeline line).
# Ctrl-C stops everything; a second Ctrl-C reports what is still stopping.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cache=${RDS_CSI_CACHE:-$root/.cache}

# What the demo runs, as build-controlplane.sh components (ONLY) with the
# binaries each leaves in .cache/bin, and its cold build time in seconds on
# the quiet 2-core machine of hack/README.md. The sidecars are built in the
# kube wrapper module after kube-apiserver and find the packages they share
# with it in the Go build cache (their own packages only: ~10-20 s each).
# kubectl and csi-resizer are not run by the demo: `make test` builds them.
# The snapshot sidecars are optional in the build; the demo skips its
# snapshot step without them.
components=(
  "etcd:etcd:50"
  "kube-apiserver:kube-apiserver:480"
  "kube-controller-manager:kube-controller-manager:90"
  "attacher:csi-attacher:15"
  "provisioner:csi-provisioner:15"
  "snapshotter:csi-snapshotter snapshot-controller:20"
)
only=() missing=() estimate=0
for c in "${components[@]}"; do
  IFS=: read -r comp bins secs <<<"$c"
  for b in $bins; do
    if [ ! -x "$cache/bin/$b" ]; then
      only+=("$comp") missing+=("$b") estimate=$((estimate + secs))
      break
    fi
  done
done
# bin/ and the demo program compile beside the control plane on the same
# cores: their cold time counts too when anything is to be built (a machine
# without the control plane is most likely one without Go's build cache).
programs=210
[ ${#missing[@]} -gt 0 ] && estimate=$((estimate + programs))

# bin/ and the demo program, in the foreground. -trimpath as in `make build`,
# so the demo program finds client-go, grpc ... compiled by it in Go's build
# cache (a build without it is another cache key: everything again).
build_programs() {
  make --no-print-directory build
  mkdir -p "$cache/demo"
  go build -trimpath -o "$cache/demo/rds-csi-demo" ./e2e/cmd/demo
}

if [ ${#missing[@]} -gt 0 ]; then
  cat <<EOF
== building what the demo runs: ${only[*]} (missing ${missing[*]} in $cache/bin)
   Estimate: about $(( (estimate + 59) / 60 )) min on a fresh 2-core machine with nothing else running
   (measured per component, hack/README.md, with bin/ and the demo program
   compiling beside them), plus module downloads; about 1 min with a warm Go build cache;
   later runs reuse $cache and start in seconds. Other builds on the same cores
   stretch it. kubectl and csi-resizer are left for 'make test'. Progress
   below; the full log of each component is in $cache/build/logs/. Ctrl-C
   stops the build.
EOF
  [ "${DEMO_PLAN_ONLY:-0}" = 1 ] && exit 0
  t0=$(date +%s)
  # In a session of its own, so that one kill stops the go commands it runs
  # too (they would hold the build lock); the EXIT trap does that when this
  # script stops early (Ctrl-C, or bin/ failed to build).
  ONLY="${only[*]}" BUILD_KUBECTL=0 setsid ./hack/build-controlplane.sh 2>&1 &
  build=$!
  # A heartbeat during the long silent compiles (kube-apiserver prints
  # nothing for minutes).
  (
    while sleep 60; do
      kill -0 "$build" 2>/dev/null || exit 0
      printf '   … still building: %d min elapsed (estimate ≈%d min)\n' $(( ($(date +%s) - t0) / 60 )) $(( (estimate + 59) / 60 ))
    done
  ) &
  beat=$!
  trap 'kill "$beat" 2>/dev/null; kill -- -"$build" 2>/dev/null || true' EXIT
  build_programs
  echo "== bin/ and the demo program built in $(( $(date +%s) - t0 )) s; the control plane is still building"
  rc=0
  wait "$build" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  trap - EXIT
  echo "== build finished in $(( $(date +%s) - t0 )) s (exit $rc)"
  [ "$rc" -eq 0 ] || { echo "hack/build-controlplane.sh failed; see $cache/build/logs/" >&2; exit "$rc"; }
else
  [ "${DEMO_PLAN_ONLY:-0}" = 1 ] && { echo "== nothing to build"; exit 0; }
  build_programs
fi

# exec: the demo program itself gets Ctrl-C (no shell in between that could
# exit before it has stopped what it started).
exec "$cache/demo/rds-csi-demo" "$@"
