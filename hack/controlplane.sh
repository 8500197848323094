#!/usr/bin/env bash
# Run a kubelet-less Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) on loopback, from the binaries that
# hack/build-controlplane.sh put in .cache/bin.
#
#   hack/controlplane.sh start  <dir>   start (or restart on the same data), wait until ready,
#                                       print the env (also written to <dir>/env) on stdout
#   hack/controlplane.sh stop   <dir>   stop by PID: controller-manager, apiserver, then etcd
#   hack/controlplane.sh status <dir>   show which components run
#   hack/controlplane.sh env    <dir>   print <dir>/env
#
# Layout of <dir>: admin.kubeconfig, env, ports, pki/, etcd-data/, pids/*.pid, logs/*.log
# <dir>/ports (ETCD_PORT=, ETCD_PEER_PORT=, APISERVER_PORT=, KCM_PORT=) is kept
# for a restart; written before the first start (the e2e harness does, from
# its port allocator), it names the ports to use while they are free.
#
# Environment knobs (defaults in brackets):
#   RDS_CSI_CACHE           cache with bin/ [<repo>/.cache]
#   ETCD_BIN, KUBE_APISERVER_BIN, KUBE_CONTROLLER_MANAGER_BIN   override binaries
#   KCM_CONTROLLERS         [*]  value of --controllers (default set includes attach-detach,
#                                persistentvolume-binder, pvc-protection, node-lifecycle)
#   PV_SYNC_PERIOD          [2s] --pvclaimbinder-sync-period
#   NODE_MONITOR_PERIOD     [2s] --node-monitor-period
#   NODE_MONITOR_GRACE      [20s] --node-monitor-grace-period
#   ATTACH_DETACH_SYNC      [10s] --attach-detach-reconcile-sync-period
#   READY_TIMEOUT           [120] seconds to wait for readiness (whole seconds, 1 to 999999)
#   APISERVER_FEATURE_GATES [WatchList=true] --feature-gates of kube-apiserver: watch-list
#                                (informers stream their initial sync instead of one LIST;
#                                on by default since 1.34, stated here because the driver's
#                                scale benchmarks depend on it; it also needs an etcd with
#                                RequestWatchProgress, 3.4.31+/3.5.13+/3.6: build-controlplane.sh)
#   KCM_EXTRA_ARGS, APISERVER_EXTRA_ARGS   appended verbatim (word-split)
#   APISERVER_AUTHORIZATION_MODE [RBAC] --authorization-mode (Node,RBAC with real kubelets)
#   APISERVER_KUBELET_CLIENT [0] 1: kube-apiserver presents the admin certificate to
#                                kubelets (--kubelet-client-certificate), for real nodes
#                                whose kubelets authenticate it (the kubelet tier)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RDS_CSI_CACHE:-$ROOT/.cache}"
BIN="$CACHE/bin"
ETCD_BIN="${ETCD_BIN:-$BIN/etcd}"
KUBE_APISERVER_BIN="${KUBE_APISERVER_BIN:-$BIN/kube-apiserver}"
KUBE_CONTROLLER_MANAGER_BIN="${KUBE_CONTROLLER_MANAGER_BIN:-$BIN/kube-controller-manager}"
KCM_CONTROLLERS="${KCM_CONTROLLERS:-*}"
PV_SYNC_PERIOD="${PV_SYNC_PERIOD:-2s}"
NODE_MONITOR_PERIOD="${NODE_MONITOR_PERIOD:-2s}"
NODE_MONITOR_GRACE="${NODE_MONITOR_GRACE:-20s}"
ATTACH_DETACH_SYNC="${ATTACH_DETACH_SYNC:-10s}"
READY_TIMEOUT="${READY_TIMEOUT:-120}"
APISERVER_KUBELET_CLIENT="${APISERVER_KUBELET_CLIENT:-0}"
APISERVER_AUTHORIZATION_MODE="${APISERVER_AUTHORIZATION_MODE:-RBAC}"
APISERVER_FEATURE_GATES="${APISERVER_FEATURE_GATES-WatchList=true}"
SERVICE_CIDR="10.0.0.0/24"
SERVICE_IP="10.0.0.1"

START_TS=$(date +%s)
log() { printf '[controlplane +%3ss] %s\n' "$(( $(date +%s) - START_TS ))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { echo "usage: $0 start|stop|status|env <dir>" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
# READY_TIMEOUT goes into shell arithmetic, which would evaluate any
# expression in it (a name reads as 0, so "abc" timed out at once).
[[ "$READY_TIMEOUT" =~ ^[1-9][0-9]{0,5}$ ]] || { echo "$0: READY_TIMEOUT=$READY_TIMEOUT: want whole seconds, 1 to 999999 (default 120)" >&2; exit 2; }
CMD=$1
mkdir -p "$2"
DIR="$(cd "$2" && pwd)"
PKI="$DIR/pki"; PIDS="$DIR/pids"; LOGS="$DIR/logs"

# Components in start order; stop goes in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager)

# pid_alive <component>: prints the PID if its pid file names a live process of that binary.
pid_alive() {
  local f="$PIDS/$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid=$(<"$f")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  # Guard against PID reuse: the process must run the component's binary.
  local exe
  exe=$(tr '\0' ' ' <"/proc/$pid/cmdline" | awk '{print $1}')
  [[ "$(basename "$exe")" == "$1"* || "$(readlink "/proc/$pid/exe" 2>/dev/null)" == *"$1"* ]] || return 1
  # A zombie is as good as gone.
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || return 1
  echo "$pid"
}

# pid_starting <component>: its launcher has not exec'd the binary yet
# (the forked shell or setsid still runs): alive, not yet recognisable by
# pid_alive. On a loaded machine the first readiness poll can come first.
pid_starting() {
  local f="$PIDS/$1.pid" pid comm
  [[ -f "$f" ]] || return 1
  pid=$(<"$f")
  [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/comm" ]] || return 1
  comm=$(<"/proc/$pid/comm")
  [[ "$comm" == setsid || "$comm" == bash ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}

stop_one() {
  local c=$1 pid i
  if ! pid=$(pid_alive "$c"); then
    rm -f "$PIDS/$c.pid"
    return 0
  fi
  log "stopping $c (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    pid_alive "$c" >/dev/null || break
    sleep 0.1
  done
  if pid_alive "$c" >/dev/null; then
    log "$c did not exit in 15s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      pid_alive "$c" >/dev/null || break
      sleep 0.1
    done
  fi
  pid_alive "$c" >/dev/null && die "$c (pid $pid) would not die"
  rm -f "$PIDS/$c.pid"
}

cmd_stop() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_one "${COMPONENTS[$i]}"; done
  log "stopped (data kept in $DIR)"
}

cmd_status() {
  local c pid rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid=$(pid_alive "$c"); then echo "$c running pid $pid"; else echo "$c stopped"; rc=1; fi
  done
  return $rc
}

# Local TCP ports of every socket on this machine, in any state (a port an
# outgoing connection uses cannot be listened on either), from /proc.
used_ports() {
  local hex
  for hex in $(awk 'FNR > 1 { n = split($2, a, ":"); print a[n] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    echo $(( 16#$hex ))
  done | sort -un
}

# free_port <already-taken...>: a random unused port below the kernel's
# ephemeral range (outgoing connections take ports from that range at any
# moment, which made a port picked there collide now and then).
free_port() {
  local used p i lo=10000 hi
  hi=$(awk '{print $1 - 1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
  (( hi > lo + 1000 )) || hi=32767
  used=" $(used_ports | tr '\n' ' ') $* "
  for ((i = 0; i < 200; i++)); do
    p=$(( lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1) ))
    [[ "$used" == *" $p "* ]] && continue
    # Nobody answers a connect either.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  die "no free port found"
}

port_free() { [[ " $(used_ports | tr '\n' ' ') " != *" $1 "* ]]; }

# ---------------------------------------------------------------- PKI
gen_pki() {
  mkdir -p "$PKI"
  [[ -f "$PKI/.done" && -f "$PKI/front-proxy-client.crt" ]] && return 0
  log "generating PKI in $PKI (openssl)"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  (
    cd "$PKI"
    umask 077
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 3650 -subj "/CN=rds-csi-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # leaf <name> <subject> <extensions>
    leaf() {
      openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%b' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 3650 -extfile "$1.ext" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    local client='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n'
    leaf apiserver "/CN=kube-apiserver" \
      "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:::1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
    leaf admin "/O=system:masters/CN=rds-csi-e2e-admin" "$client"
    leaf kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    # Front-proxy (request-header) CA and client: lets the controller-manager's
    # delegated authn find a complete extension-apiserver-authentication configmap.
    openssl req -x509 "${ec[@]}" -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
      -subj "/CN=rds-csi-e2e-front-proxy-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    openssl req -new "${ec[@]}" -keyout front-proxy-client.key -out front-proxy-client.csr -subj "/CN=front-proxy-client" 2>/dev/null
    printf '%b' "$client" >front-proxy-client.ext
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
      -out front-proxy-client.crt -days 3650 -extfile front-proxy-client.ext 2>/dev/null
    rm -f front-proxy-client.csr front-proxy-client.ext
    # Service-account token signing key pair.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 644 ./*.crt sa.pub
  )
  touch "$PKI/.done"
}

b64() { base64 -w0 <"$1"; }

# write_kubeconfig <file> <user> <cert-base>
write_kubeconfig() {
  cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rds-csi-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$PKI/$3.crt")
    client-key-data: $(b64 "$PKI/$3.key")
contexts:
- name: rds-csi-e2e
  context:
    cluster: rds-csi-e2e
    user: $2
current-context: rds-csi-e2e
EOF
  chmod 600 "$1.tmp"
  mv "$1.tmp" "$1"
}

# ---------------------------------------------------------------- start helpers
# launch <component> <binary> <args...>: detached (own session), PID in pids/, log in logs/
launch() {
  local c=$1 bin=$2; shift 2
  printf '%q ' "$bin" "$@" >"$LOGS/$c.cmdline"; echo >>"$LOGS/$c.cmdline"
  echo "==== $(date -u +%FT%TZ) start" >>"$LOGS/$c.log"
  setsid "$bin" "$@" </dev/null >>"$LOGS/$c.log" 2>&1 &
  echo $! >"$PIDS/$c.pid"
  log "started $c (pid $!, log $LOGS/$c.log)"
}

fail_start() {
  local c=$1; shift
  log "ERROR: $*"
  if [[ -f "$LOGS/$c.log" ]]; then
    log "last lines of $LOGS/$c.log:"
    tail -n 25 "$LOGS/$c.log" >&2
    # Lost a race for a port: cmd_start tries again with new ones.
    if tail -n 25 "$LOGS/$c.log" | grep -q 'address already in use'; then
      touch "$DIR/.port-conflict"
    fi
  fi
  cmd_stop
  exit 1
}

# wait_for <component> <what> <command...>: poll until the command succeeds.
wait_for() {
  local c=$1 what=$2; shift 2
  local deadline=$(( $(date +%s) + READY_TIMEOUT ))
  until "$@" >/dev/null 2>&1; do
    pid_alive "$c" >/dev/null || pid_starting "$c" || fail_start "$c" "$c exited while waiting for $what"
    (( $(date +%s) < deadline )) || fail_start "$c" "timed out after ${READY_TIMEOUT}s waiting for $what"
    sleep 0.3
  done
  log "$what: ok"
}

curl_admin() { # <path>
  curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT$1"
}
etcd_healthy() { [[ "$(curl -sf --max-time 3 "http://127.0.0.1:$ETCD_PORT/health")" == *'"health":"true"'* ]]; }
apiserver_ready() { [[ "$(curl_admin /readyz)" == ok ]]; }
kcm_healthy() { [[ "$(curl -sk --max-time 3 "https://127.0.0.1:$KCM_PORT/healthz")" == ok ]]; }

write_env() {
  cat >"$DIR/env.tmp" <<EOF
export KUBECONFIG=$DIR/admin.kubeconfig
export RDS_CSI_CONTROLPLANE_DIR=$DIR
export RDS_CSI_BIN_DIR=$BIN
export KUBE_APISERVER_URL=https://127.0.0.1:$APISERVER_PORT
export KUBE_CA_FILE=$PKI/ca.crt
export KUBE_ADMIN_CERT=$PKI/admin.crt
export KUBE_ADMIN_KEY=$PKI/admin.key
export ETCD_ENDPOINT=http://127.0.0.1:$ETCD_PORT
export KCM_HEALTHZ_URL=https://127.0.0.1:$KCM_PORT/healthz
EOF
  mv "$DIR/env.tmp" "$DIR/env"
}

# Start, and when a component lost a port to another process between the
# pick and its bind, stop and start again on new ports (up to 3 times).
cmd_start() {
  local attempt rc
  for attempt in 1 2 3; do
    rm -f "$DIR/.port-conflict"
    # A subshell so that its exit (fail_start, die) comes back here; not in
    # an if, which would switch errexit off inside it.
    set +e
    (set -e; start_once)
    rc=$?
    set -e
    if [[ $rc == 0 ]]; then
      cat "$DIR/env"
      return 0
    fi
    [[ -f "$DIR/.port-conflict" ]] || exit "$rc"
    log "port conflict on attempt $attempt; picking new ports"
    rm -f "$DIR/ports" "$DIR/.port-conflict"
    rm -rf "$DIR/etcd-data"   # it remembers the old peer URL
  done
  die "ports kept conflicting"
}

start_once() {
  local c
  for c in "$ETCD_BIN" "$KUBE_APISERVER_BIN" "$KUBE_CONTROLLER_MANAGER_BIN"; do
    [[ -x "$c" ]] || die "$c missing: run hack/build-controlplane.sh first"
  done
  command -v openssl >/dev/null || die "openssl is needed"
  command -v curl >/dev/null || die "curl is needed"
  mkdir -p "$PIDS" "$LOGS" "$DIR/etcd-data"
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c" >/dev/null; then
      die "$c already runs from $DIR (pid $(<"$PIDS/$c.pid")); '$0 stop $DIR' first"
    fi
  done

  # Ports: reuse the ones from a previous run on the same dir when still free
  # (etcd remembers its peer URL), otherwise pick new ones.
  ETCD_PORT="" ETCD_PEER_PORT="" APISERVER_PORT="" KCM_PORT=""
  if [[ -f "$DIR/ports" ]]; then
    # shellcheck disable=SC1091
    source "$DIR/ports"
    for c in "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT"; do
      if [[ -z "$c" ]] || ! port_free "$c"; then
        ETCD_PORT="" ETCD_PEER_PORT="" APISERVER_PORT="" KCM_PORT=""
        break
      fi
    done
  fi
  if [[ -z "$ETCD_PORT" ]]; then
    ETCD_PORT=$(free_port)
    ETCD_PEER_PORT=$(free_port "$ETCD_PORT")
    APISERVER_PORT=$(free_port "$ETCD_PORT" "$ETCD_PEER_PORT")
    KCM_PORT=$(free_port "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT")
    printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPISERVER_PORT=%s\nKCM_PORT=%s\n' \
      "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT" >"$DIR/ports"
  fi
  log "ports: etcd $ETCD_PORT (peer $ETCD_PEER_PORT), kube-apiserver $APISERVER_PORT, kube-controller-manager $KCM_PORT"

  gen_pki
  write_kubeconfig "$DIR/admin.kubeconfig" rds-csi-e2e-admin admin
  write_kubeconfig "$DIR/kube-controller-manager.kubeconfig" system:kube-controller-manager kube-controller-manager

  # ---- etcd
  # Its version decides whether kube-apiserver offers watch-list (above).
  log "etcd: $("$ETCD_BIN" --version 2>/dev/null | awk '/etcd Version/{print $3}') ($ETCD_BIN)"
  launch etcd "$ETCD_BIN" \
    --name=e2e \
    --data-dir="$DIR/etcd-data" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --logger=zap --log-outputs=stderr \
    --quota-backend-bytes=$((2 * 1024 * 1024 * 1024)) \
    --auto-compaction-mode=periodic --auto-compaction-retention=5m
  wait_for etcd "etcd /health" etcd_healthy

  # ---- kube-apiserver
  local kubelet_client=()
  [[ "$APISERVER_KUBELET_CLIENT" == 1 ]] && kubelet_client=(--kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key")
  # shellcheck disable=SC2086
  launch kube-apiserver "$KUBE_APISERVER_BIN" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="$APISERVER_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode="$APISERVER_AUTHORIZATION_MODE" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --allow-privileged=true \
    --profiling=false \
    ${APISERVER_FEATURE_GATES:+--feature-gates="$APISERVER_FEATURE_GATES"} \
    "${kubelet_client[@]}" \
    --v=1 \
    ${APISERVER_EXTRA_ARGS:-}
  wait_for kube-apiserver "kube-apiserver /readyz" apiserver_ready

  # ---- kube-controller-manager
  # shellcheck disable=SC2086
  launch kube-controller-manager "$KUBE_CONTROLLER_MANAGER_BIN" \
    --kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$KCM_PORT" \
    --cert-dir="$PKI/kcm-serving" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" \
    --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --controllers="$KCM_CONTROLLERS" \
    --pvclaimbinder-sync-period="$PV_SYNC_PERIOD" \
    --node-monitor-period="$NODE_MONITOR_PERIOD" \
    --node-monitor-grace-period="$NODE_MONITOR_GRACE" \
    --attach-detach-reconcile-sync-period="$ATTACH_DETACH_SYNC" \
    --profiling=false \
    --v=2 \
    ${KCM_EXTRA_ARGS:-}
  wait_for kube-controller-manager "kube-controller-manager /healthz" kcm_healthy

  write_env
  log "control plane ready in $(( $(date +%s) - START_TS ))s; env in $DIR/env"
}

case "$CMD" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) [[ -f "$DIR/env" ]] || die "no $DIR/env (not started?)"; cat "$DIR/env" ;;
  *) usage ;;
esac
