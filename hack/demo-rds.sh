#!/usr/bin/env bash
# make demo-rds: start the RDS simulator on loopback and walk a volume through
# create -> print -> resize -> snapshot -> restore -> delete over real SSH,
# printing each RouterOS command and what RouterOS returned.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=bin
for b in rds-sim rdsctl; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: run 'make build'" >&2; exit 1; }
done

work=$(mktemp -d /tmp/rds-csi-demo.XXXXXX)
sim_pid=
cleanup() {
  if [ -n "$sim_pid" ] && kill -0 "$sim_pid" 2>/dev/null; then
    kill -TERM "$sim_pid" 2>/dev/null || true
    wait "$sim_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

step_no=0
step() { step_no=$((step_no + 1)); printf '\n\033[1m%d. %s\033[0m\n' "$step_no" "$*"; }

step "generate the driver's SSH key pair"
"$bin/rdsctl" gen-key "$work/id_ed25519"

step "start the RDS simulator (real SSH, sparse files under $work/rds, 20 GiB pool, 2 ms latency per command)"
"$bin/rds-sim" --listen 127.0.0.1:0 --data-dir "$work/rds" --pool-size 20G \
  --authorized-keys "$work/id_ed25519.pub" --write-known-hosts "$work/known_hosts" \
  --latency 2ms >"$work/sim.log" 2>&1 &
sim_pid=$!
addr=
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^rds-sim listening on //p' "$work/sim.log")
  [ -n "$addr" ] && break
  kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.log"; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "simulator did not start" >&2; cat "$work/sim.log"; exit 1; }
cat "$work/sim.log"
echo "pinned host key:"; sed 's/^/  /' "$work/known_hosts"

rdsctl() {
  local start end
  start=$(date +%s%N)
  "$bin/rdsctl" --address "${addr%:*}" --port "${addr##*:}" --user admin \
    --key "$work/id_ed25519" --known-hosts "$work/known_hosts" \
    --base-path /storage-pool/kubernetes-volumes --show-commands "$@"
  end=$(date +%s%N)
  printf '  (%d ms)\n' $(( (end - start) / 1000000 ))
}

step "probe the RDS"
rdsctl probe
step "pool capacity"
rdsctl capacity
step "create a 1.5 GiB volume (sent as 1536M: sizes are rounded up to a whole MiB, never down)"
rdsctl create pvc-demo 1610612736
step "print it"
rdsctl get pvc-demo
step "write data into the volume's backing file (what a node would do over NVMe/TCP)"
backing=$(find "$work/rds" -name 'pvc-demo.img')
printf 'hello from the demo' | dd of="$backing" bs=1 seek=4096 conv=notrunc status=none
echo "  wrote 19 bytes at offset 4096 of $backing"
step "resize to 3 GiB (grow only)"
rdsctl resize pvc-demo 3G
step "snapshot it (copy-from, not exported)"
rdsctl copy snap-demo pvc-demo
step "restore the snapshot into a new 4 GiB volume"
rdsctl copy pvc-restored snap-demo 4G
restored=$(find "$work/rds" -name 'pvc-restored.img')
printf '  restored content at offset 4096: "%s"\n' "$(dd if="$restored" bs=1 skip=4096 count=19 status=none)"
step "list every disk"
rdsctl list
step "a bad request is refused before anything is sent"
rdsctl get 'pvc-demo;/system reboot' || true
step "delete the volume: its snapshot is an independent copy and survives"
rdsctl delete pvc-demo
rdsctl get snap-demo
step "clean up"
rdsctl delete pvc-restored
rdsctl delete snap-demo
rdsctl capacity
step "stop the simulator"
kill -TERM "$sim_pid"; wait "$sim_pid" || true; sim_pid=
echo "done: every step above ran over SSH against the simulator; its files were under $work"
