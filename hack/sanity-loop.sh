#!/usr/bin/env bash
# csi-sanity's Node specs against the shipped binaries, run as an outsider
# would: the standalone csi-sanity command (kubernetes-csi/csi-test, at the
# version go.mod requires) talks to bin/rds-csi-driver --mode=all
# --publish=false --node-connector=loop over its socket, and the driver
# talks SSH to bin/rds-sim. Volumes are loop devices over the simulator's
# backing files, so the real stage / mkfs / mount / publish / expand code
# runs without NVMe/TCP (docs/node.md, "Labs and demos").
#
# The in-process TestSanity (pkg/csi/sanity_test.go) covers the same specs
# and the controller's; this run checks the things only the binaries have:
# flag parsing and validation, --node-connector=loop wiring, the
# simulator's data-dir layout as the driver's --node-loop-data-dir, and
# shutdown. Afterwards nothing may stay mounted or attached.
#
# Needs root (losetup, mount) and the tools `make deps` installs. Without
# root it skips, or fails when CI is set. Usage: hack/sanity-loop.sh
# [extra csi-sanity flags]; BIN (default bin) holds the built binaries.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN="${BIN:-bin}"
CACHE_BIN=".cache/bin"

log() { echo "sanity-loop: $*" >&2; }
die() { log "$*"; exit 1; }

if [[ $(id -u) != 0 ]]; then
  [[ -n "${CI:-}" ]] && die "needs root (losetup, mount), and CI is set"
  log "SKIP: needs root (losetup, mount); the node specs cannot run"
  exit 0
fi
for tool in losetup mkfs.ext4 mkfs.xfs blkid resize2fs xfs_growfs; do
  command -v "$tool" >/dev/null || die "$tool is missing: run make deps (hack/install-deps.sh)"
done
for b in rds-sim rds-csi-driver rdsctl; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b is missing: run make build"
done

# The csi-sanity command at the csi-test version go.mod requires, built
# once into the cache (about 10 s warm).
version=$(go list -m -f '{{.Version}}' github.com/kubernetes-csi/csi-test/v5)
sanity="$CACHE_BIN/csi-sanity-$version"
if [[ ! -x "$sanity" ]]; then
  log "building csi-sanity $version into $sanity"
  mkdir -p "$CACHE_BIN"
  go build -o "$sanity.tmp" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
  mv "$sanity.tmp" "$sanity"
fi
ln -sfn "csi-sanity-$version" "$CACHE_BIN/csi-sanity"

dir=$(mktemp -d "${TMPDIR:-/tmp}/rds-csi-sanity-loop.XXXXXX")
sim_pid="" driver_pid=""
cleanup() {
  local code=$?
  # Our own processes only, by PID; SIGTERM is the driver's graceful stop.
  for pid in $driver_pid $sim_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # What the driver should have undone; undo it so the machine stays clean.
  while read -r mnt; do umount "$mnt" 2>/dev/null || umount -l "$mnt" || true; done < <(awk -v d="$dir" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  while read -r dev; do losetup -d "$dev" || true; done < <(losetup --list --noheadings -O NAME,BACK-FILE | awk -v d="$dir" 'index($2, d) == 1 {print $1}')
  if [[ $code == 0 ]]; then rm -rf "$dir"; else log "kept $dir (logs: sim.log, driver.log)"; fi
}
trap cleanup EXIT

"$BIN/rdsctl" gen-key "$dir/id_ed25519" >/dev/null
cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
mkdir -p "$dir/pool"

# The simulator on a free loopback port; its first stdout line names it.
"$BIN/rds-sim" --listen 127.0.0.1:0 --data-dir "$dir/pool" --pool-size 4T --nvme-export=none \
  --authorized-keys "$dir/authorized_keys" --write-known-hosts "$dir/known_hosts" >"$dir/sim.out" 2>"$dir/sim.log" &
sim_pid=$!
addr=""
for _ in $(seq 100); do
  addr=$(sed -n 's/^rds-sim listening on //p' "$dir/sim.out")
  [[ -n "$addr" ]] && break
  kill -0 "$sim_pid" 2>/dev/null || die "rds-sim exited: $(cat "$dir/sim.log")"
  sleep 0.1
done
[[ -n "$addr" ]] || die "rds-sim did not start within 10 s"

endpoint="$dir/csi.sock"
"$BIN/rds-csi-driver" --mode=all --publish=false --endpoint="unix://$endpoint" --node-id=sanity-node \
  --rds-address=127.0.0.1 --rds-port="${addr##*:}" --rds-key-file="$dir/id_ed25519" --rds-known-hosts-file="$dir/known_hosts" \
  --node-connector=loop --node-loop-data-dir="$dir/pool" --shutdown-grace=5s 2>"$dir/driver.log" &
driver_pid=$!
for _ in $(seq 100); do
  [[ -S "$endpoint" ]] && break
  kill -0 "$driver_pid" 2>/dev/null || die "rds-csi-driver exited: $(tail -5 "$dir/driver.log")"
  sleep 0.1
done
[[ -S "$endpoint" ]] || die "rds-csi-driver did not listen within 10 s"

# StorageClass-style parameters, as external-provisioner passes them (the
# driver refuses keys of its own); a size that is not a whole GiB.
cat >"$dir/params.yaml" <<'EOF'
csi.storage.k8s.io/pvc/name: sanity
csi.storage.k8s.io/pvc/namespace: default
EOF
start=$(date +%s)
"$sanity" --csi.endpoint="$endpoint" --csi.stagingdir="$dir/staging" --csi.mountdir="$dir/target" \
  --csi.testvolumesize=$((1024 * 1024 * 1024 + 24 * 1024 * 1024)) --csi.testvolumeparameters="$dir/params.yaml" \
  --csi.junitfile="$dir/junit.xml" --ginkgo.focus='Node Service' --ginkgo.no-color --ginkgo.succinct "$@" | tee "$dir/sanity.out"
# Counts from the JUnit report's <testsuite> attributes: "tests" is every
# spec of csi-test, the unfocused (controller) ones among the skipped.
suite=$(grep -o '<testsuite [^>]*>' "$dir/junit.xml" | head -1)
attr() { sed -n "s/.* $1=\"\([0-9]*\)\".*/\1/p" <<<"$suite"; }
tests=$(attr tests) failed=$(( $(attr failures) + $(attr errors) )) skipped=$(( $(attr skipped) + $(attr disabled) ))
log "csi-sanity: $(( tests - failed - skipped )) passed, $failed failed, $skipped skipped of $tests specs in $(( $(date +%s) - start )) s"

# The driver stops gracefully, and left nothing behind.
kill "$driver_pid"
wait "$driver_pid" || die "rds-csi-driver exited with $? after SIGTERM: $(tail -5 "$dir/driver.log")"
driver_pid=""
left=$(awk -v d="$dir" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo; losetup --list --noheadings -O NAME,BACK-FILE | awk -v d="$dir" 'index($2, d) == 1')
[[ -z "$left" ]] || die "left behind after csi-sanity: $left"
# Every unstage and unpublish removed the node's record of that mount
# (--node-state-dir, by default node-state beside the socket).
records=$(find "$dir/node-state" -type f 2>/dev/null || true)
[[ -z "$records" ]] || die "mount records left behind after csi-sanity: $records"
disks=$("$BIN/rdsctl" --address 127.0.0.1 --port "${addr##*:}" --user admin --key "$dir/id_ed25519" --known-hosts "$dir/known_hosts" list 2>&1 | grep -c 'pvc-' || true)
[[ "$disks" == 0 ]] || die "csi-sanity left $disks volumes on the simulator"
log "ok: no mounts, mount records, loop devices or volumes left"
