#!/usr/bin/env bash
# make demo: the driver on a real, kubelet-less control plane. Builds what is
# missing (hack/build-controlplane.sh: etcd, kube-apiserver,
# kube-controller-manager, the csi sidecars), then runs e2e/cmd/demo, which
# starts the control plane, the RDS simulator and the driver with its
# sidecars (as the e2e suite does) and walks a volume through provision ->
# attach -> node failure -> fenced handoff -> snapshot -> cleanup.
# Arguments go to the demo program (-v: every timeline line).
# Ctrl-C stops everything; a second Ctrl-C reports what is still stopping.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cache=${RDS_CSI_CACHE:-$root/.cache}

# What the demo uses from .cache/bin (the snapshot sidecars are optional in
# the build; the demo skips its snapshot step without them).
missing=()
for b in etcd kube-apiserver kube-controller-manager csi-provisioner csi-attacher csi-snapshotter snapshot-controller; do
  [ -x "$cache/bin/$b" ] || missing+=("$b")
done

if [ ${#missing[@]} -gt 0 ]; then
  cat <<EOF
== building the control plane: missing ${missing[*]} in $cache/bin
   A first build on a fresh machine takes about 30 minutes on 2 cores
   (kube-apiserver alone ~8 min, each sidecar 4-6 min; downloads from the Go
   module proxy come on top); with the Go build cache warm it takes ~1 min,
   and later runs reuse $cache and start in seconds. Progress below; the full
   log of each component is in $cache/build/logs/. Ctrl-C stops the build.
EOF
  t0=$(date +%s)
  ./hack/build-controlplane.sh 2>&1 &
  build=$!
  # A heartbeat during the long silent compiles (kube-apiserver prints
  # nothing for minutes).
  (
    while sleep 60; do
      kill -0 "$build" 2>/dev/null || exit 0
      printf '   … still building: %d min elapsed (cold total ≈30 min)\n' $(( ($(date +%s) - t0) / 60 ))
    done
  ) &
  beat=$!
  trap 'kill "$beat" 2>/dev/null || true' EXIT
  rc=0
  wait "$build" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  trap - EXIT
  echo "== build finished in $(( $(date +%s) - t0 )) s (exit $rc)"
  [ "$rc" -eq 0 ] || { echo "hack/build-controlplane.sh failed; see $cache/build/logs/" >&2; exit "$rc"; }
fi

mkdir -p "$cache/demo"
go build -o "$cache/demo/rds-csi-demo" ./e2e/cmd/demo
# exec: the demo program itself gets Ctrl-C (no shell in between that could
# exit before it has stopped what it started).
exec "$cache/demo/rds-csi-demo" "$@"
