#!/usr/bin/env bash
# The real control plane for arbiter's end-to-end tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok, built from source at a pinned release
# and started on 127.0.0.1.
#
#   e2e/cluster.sh build          build (or reuse) the cached binaries; prints their directory
#   eval "$(e2e/cluster.sh up)"   start a cluster; exports KUBECONFIG and ARBITER_E2E_DIR
#   e2e/cluster.sh up --node      also a real node (containerd, kubelet, kube-proxy, CNI; see
#                                 e2e/node.sh): one per machine at a time, tainted
#                                 arbiter.dev/real-node so only pods that tolerate it land there
#   e2e/cluster.sh import DIR TAR...  import docker-archive images into DIR's real node
#   e2e/cluster.sh down [DIR]     stop exactly the processes `up` started, remove DIR
#   e2e/cluster.sh restart DIR C  restart component C (etcd, kube-apiserver, ...) in place
#   e2e/cluster.sh env            print the pinned versions and the cache directory
#   e2e/cluster.sh promtool       build (or reuse) promtool, for the chart's alert tests; prints
#                                 its path (cached by version, apart from the control plane)
#   e2e/cluster.sh tool NAME      the same for a release or lint tool: crane, syft, helm-docs,
#                                 actionlint (`make release`, `make publish`, `make lint`)
#
# `build` also builds helm (for the chart's tests), cached beside the control plane.
#
# Every cluster lives in its own directory (logs, certificates, data, kubeconfigs, pids) with
# its own random ports, so several can run at once. Progress goes to stderr; `up` prints only
# the export lines on stdout.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The pinned Kubernetes release is the one e2e/go.mod requires; etcd is the version that
# release's go.mod pins; kwok is pinned here. KUBE_VERSION=1.33 (a minor) selects another
# supported release instead: the module in e2e/versions/1.33 (e2e/gen-gomod.sh writes it).
pinned_release() { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$1/go.mod"; }
MOD_DIR=$E2E_DIR
if [[ -n ${KUBE_VERSION:-} ]]; then
  KUBE_VERSION=${KUBE_VERSION#v}
  pinned=$(pinned_release "$E2E_DIR")
  if [[ $KUBE_VERSION != "$(cut -d. -f1,2 <<<"${pinned#v}")" ]]; then
    MOD_DIR=$E2E_DIR/versions/$KUBE_VERSION
    [[ -f $MOD_DIR/go.mod ]] || {
      printf '[cluster] error: KUBE_VERSION=%s is not one the harness builds (it builds %s and: %s)\n' \
        "$KUBE_VERSION" "$pinned" "$(ls "$E2E_DIR/versions" | tr '\n' ' ')" >&2
      exit 1
    }
  fi
fi
K8S_VERSION=$(pinned_release "$MOD_DIR")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2; exit}' "$MOD_DIR/go.mod")
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
# Prometheus 3.16's Go module version (its tags are v3.x; the module's are v0.3xx).
PROMETHEUS_VERSION=v0.316.0
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/arbiter-e2e
BIN_DIR=$CACHE_ROOT/$K8S_VERSION
# CoreDNS: the real node's cluster DNS (pods resolve Service names, as `helm test` needs).
COREDNS_VERSION=v1.14.7
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd kwok helm coredns)

# shellcheck source=e2e/node.sh
source "$E2E_DIR/node.sh"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

# The cache key beyond the Kubernetes version: anything that changes what we build.
build_stamp() {
  cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" <(echo "kwok=$KWOK_VERSION etcd=$ETCD_VERSION helm=$HELM_VERSION coredns=$COREDNS_VERSION version-ldflags=1") \
    <(go env GOVERSION) | sha256sum | cut -c1-16
}

cmd_build() {
  command -v go >/dev/null || die "go is not installed: the control plane is built from source with Go"
  mkdir -p "$BIN_DIR"
  exec 9>"$BIN_DIR/.lock"
  flock 9 # one build per cache directory at a time
  local stamp; stamp=$(build_stamp)
  if [[ -f $BIN_DIR/.stamp && $(cat "$BIN_DIR/.stamp") == "$stamp" ]]; then
    local all=1 b
    for b in "${BINARIES[@]}"; do [[ -x $BIN_DIR/$b ]] || all=0; done
    if ((all)); then echo "$BIN_DIR"; return; fi
  fi
  rm -f "$BIN_DIR/.stamp"
  local buildlog=$BIN_DIR/build.log start=$SECONDS
  : >"$buildlog"
  log "building the control plane (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION, CoreDNS $COREDNS_VERSION)"
  log "first build on 2 cores takes about 15 minutes; log: $buildlog"
  # The version the API server reports (/version): without it a source build says
  # v0.0.0-master, and charts with a kubeVersion constraint (ours) refuse to install.
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local version_flags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  version_flags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  version_flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  local flags=(-trimpath -buildvcs=false -ldflags "-s -w $version_flags")
  export CGO_ENABLED=0
  local pkg name
  for pkg in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy go.etcd.io/etcd/server/v3; do
    name=${pkg##*/}; [[ $name == v3 ]] && name=etcd
    log "  building $name ($((SECONDS - start))s so far)"
    (cd "$MOD_DIR" && go build "${flags[@]}" -o "$BIN_DIR/$name.tmp" "$pkg") >>"$buildlog" 2>&1 \
      || { tail -30 "$buildlog" >&2; die "building $name failed (full log: $buildlog)"; }
    mv "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
  done
  # kwok, helm and CoreDNS have no replace directives, so `go install module@version` builds them.
  local gobin tool
  for tool in "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    "github.com/coredns/coredns@$COREDNS_VERSION"; do
    name=${tool%@*}; name=${name##*/}
    log "  building $name ($((SECONDS - start))s so far)"
    gobin=$(mktemp -d)
    GOBIN=$gobin go install "${flags[@]}" "$tool" >>"$buildlog" 2>&1 \
      || { tail -30 "$buildlog" >&2; die "building $name failed (full log: $buildlog)"; }
    mv "$gobin/$name" "$BIN_DIR/$name"; rmdir "$gobin"
  done
  echo "$stamp" >"$BIN_DIR/.stamp"
  log "control plane built in $((SECONDS - start))s, cached in $BIN_DIR"
  echo "$BIN_DIR"
}

# N free TCP ports on 127.0.0.1, all distinct (held open together while choosing).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# Start a component in its own session, logging to DIR/logs/NAME.log; record its pid.
start() {
  local name=$1; shift
  setsid "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$DIR/pids"
}

# Fail with the component's log if it died.
check_alive() {
  local name=$1 pid
  pid=$(awk -v n="$name" '$1 == n {print $2}' "$DIR/pids" | tail -1)
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -25 "$DIR/logs/$name.log" >&2 || true
    cmd_down "$DIR" >/dev/null 2>&1 || true
    die "$name exited during start-up (log above; the cluster was torn down)"
  fi
}

# Poll CMD until it succeeds, or fail after DEADLINE seconds naming WHAT and COMPONENT's log.
wait_for() {
  local what=$1 component=$2 deadline=$3; shift 3
  local until=$((SECONDS + deadline))
  until "$@" >/dev/null 2>&1; do
    check_alive "$component"
    ((SECONDS < until)) || {
      tail -25 "$DIR/logs/$component.log" >&2
      cmd_down "$DIR" >/dev/null 2>&1 || true
      die "timed out after ${deadline}s waiting for $what (log of $component above)"
    }
    sleep 0.2
  done
}

write_kubeconfig() {
  local file=$1 user=$2 token=$3
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: arbiter-e2e
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $user
  user:
    token: $token
contexts:
- name: arbiter-e2e
  context: {cluster: arbiter-e2e, user: $user}
current-context: arbiter-e2e
EOF
}

cmd_up() {
  local node=0
  if [[ ${1:-} == --node ]]; then node=1; shift; fi
  local bin; bin=$(cmd_build)
  local t0=$SECONDS
  DIR=${1:-$(mktemp -d "${TMPDIR:-/tmp}/arbiter-e2e.XXXXXX")}
  mkdir -p "$DIR/logs" "$DIR/pki" "$DIR/etcd"
  : >"$DIR/pids"
  # A start that fails half way stops what it started (an API server and etcd left running
  # would weigh on every later test and benchmark); the logs are kept beside it.
  trap 'abandon_up "$DIR"' EXIT
  read -r ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT KUBELET_PORT \
    PROXY_HEALTHZ_PORT PROXY_METRICS_PORT <<<"$(free_ports 9)"
  # Without a node the API server is reachable on loopback only. With one, pods reach it on
  # the bridge's address, which the `kubernetes` Service's endpoint then names.
  local api_address=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none)
  if ((node)); then
    node_tools_check
    api_address=(--bind-address 0.0.0.0 --advertise-address "$NODE_GATEWAY"
      --kubelet-preferred-address-types InternalIP)
  fi

  # PKI: a CA, a serving certificate for 127.0.0.1, and the service-account signing key.
  (
    cd "$DIR/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 7 \
      -subj "/CN=arbiter-e2e-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' \
      "$NODE_GATEWAY" >san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
      -extfile san.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "generating certificates with openssl failed"
  ADMIN_TOKEN=$(openssl rand -hex 24)
  USER_TOKEN=$(openssl rand -hex 24)
  printf '%s,admin,admin,"system:masters"\n%s,e2e-unprivileged,e2e-unprivileged\n' \
    "$ADMIN_TOKEN" "$USER_TOKEN" >"$DIR/pki/tokens.csv"
  write_kubeconfig "$DIR/kubeconfig" admin "$ADMIN_TOKEN"
  write_kubeconfig "$DIR/kubeconfig-unprivileged" e2e-unprivileged "$USER_TOKEN"

  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  start etcd "$bin/etcd" --name e2e --data-dir "$DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT"
  wait_for "etcd health" etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

  log "starting kube-apiserver on https://127.0.0.1:$API_PORT"
  # shellcheck disable=SC2086 # extra flags are word-split on purpose
  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    "${api_address[@]}" --secure-port "$API_PORT" \
    --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
    --client-ca-file "$DIR/pki/ca.crt" --token-auth-file "$DIR/pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-key-file "$DIR/pki/sa.pub" \
    --service-account-signing-key-file "$DIR/pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/24 \
    --allow-privileged --profiling=false ${ARBITER_E2E_APISERVER_FLAGS:-}
  wait_for "kube-apiserver /readyz" kube-apiserver 90 \
    curl -sf --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$API_PORT/readyz"

  log "starting kube-controller-manager, kube-scheduler and kwok"
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$DIR/kubeconfig" --authentication-kubeconfig "$DIR/kubeconfig" \
    --authorization-kubeconfig "$DIR/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --controllers '*,-node-ipam-controller,-persistentvolume-attach-detach-controller,-persistentvolume-binder-controller,-persistentvolume-expander-controller' \
    --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
    --node-monitor-grace-period 60s --profiling=false
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$DIR/kubeconfig" --authentication-kubeconfig "$DIR/kubeconfig" \
    --authorization-kubeconfig "$DIR/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
  start kwok "$bin/kwok" --kubeconfig "$DIR/kubeconfig" --config "$E2E_DIR/kwok/stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-label-selector type=kwok \
    --node-ip 127.0.0.1 --server-address "127.0.0.1:$KWOK_PORT"

  local k=(kubectl --kubeconfig "$DIR/kubeconfig")
  "${k[@]}" apply -f - >/dev/null <<EOF || die "creating the kwok node failed"
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-0, kubernetes.io/os: linux}
EOF
  wait_for "node kwok-node-0 to be Ready" kwok 60 \
    "${k[@]}" wait --for=condition=Ready node/kwok-node-0 --timeout=2s
  wait_for "the default ServiceAccount" kube-controller-manager 60 \
    "${k[@]}" get serviceaccount default -n default
  for c in kube-controller-manager kube-scheduler kwok; do check_alive "$c"; done
  if ((node)); then
    node_up "$bin" "$KUBELET_PORT" "$PROXY_HEALTHZ_PORT" "$PROXY_METRICS_PORT"
  fi
  trap - EXIT
  log "cluster up in $((SECONDS - t0))s: $DIR"
  echo "export KUBECONFIG=$DIR/kubeconfig"
  echo "export ARBITER_E2E_DIR=$DIR"
}

# Stops a cluster whose start failed, keeping its logs in DIR.logs.
abandon_up() {
  local dir=$1
  rm -rf "$dir.logs"
  cp -r "$dir/logs" "$dir.logs" 2>/dev/null || true
  cmd_down "$dir" >/dev/null 2>&1 || true
  log "the cluster did not start; what it started is stopped; its logs: $dir.logs"
}

cmd_down() {
  local dir=${1:-${ARBITER_E2E_DIR:-}}
  [[ -n $dir ]] || die "which cluster? pass its directory or set ARBITER_E2E_DIR"
  [[ -f $dir/pids ]] || die "$dir is not a cluster directory (no pids file)"
  node_down_containers "$dir"
  local name pid pids=()
  while read -r name pid; do
    # Only signal a pid that is still the process we started (its command line names $dir).
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$dir"; then
      kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    fi
  done < <(tac "$dir/pids")
  local until=$((SECONDS + 15))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < until)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  node_down_host "$dir" "$BIN_DIR"
  rm -rf "$dir"
  log "cluster $dir stopped"
}

# Restart one component with the same command line (for fault injection): SIGTERM, wait,
# start again, wait until it serves.
cmd_restart() {
  DIR=${1:?cluster directory}; local name=${2:?component}
  local pid; pid=$(awk -v n="$name" '$1 == n {print $2}' "$DIR/pids" | tail -1)
  [[ -n $pid && -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$DIR" \
    || die "$name is not running in $DIR"
  local -a argv; mapfile -d '' argv <"/proc/$pid/cmdline"
  kill -TERM "$pid"
  local until=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < until)); do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  setsid "${argv[@]}" >>"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$DIR/pids"
  local token port
  token=$(awk -F, '$2 == "admin" {print $1}' "$DIR/pki/tokens.csv")
  port=$(awk '/server:/ {sub(/.*:/, "", $2); print $2}' "$DIR/kubeconfig")
  wait_for "kube-apiserver /readyz after restarting $name" "$name" 90 \
    curl -sf --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $token" "https://127.0.0.1:$port/readyz"
  log "$name restarted"
}

# promtool, built from its Go module like helm, cached by version in a directory of its own (a
# new Prometheus version does not rebuild the control plane).
cmd_promtool() {
  local dir=$CACHE_ROOT/promtool-$PROMETHEUS_VERSION
  if [[ -x $dir/promtool ]]; then
    echo "$dir/promtool"
    return
  fi
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [[ ! -x $dir/promtool ]]; then
    log "building promtool (Prometheus module $PROMETHEUS_VERSION); a few minutes, once"
    local gobin buildlog start=$SECONDS
    gobin=$(mktemp -d)
    buildlog=$dir/build.log
    GOBIN=$gobin go install -trimpath "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
      >"$buildlog" 2>&1 || { tail -30 "$buildlog" >&2; die "building promtool failed (full log: $buildlog)"; }
    mv "$gobin/promtool" "$dir/promtool"; rmdir "$gobin"
    log "promtool built in $((SECONDS - start))s, cached in $dir"
  fi
  echo "$dir/promtool"
}

# Release and lint tools, each built from its Go module at a pinned version and cached in a
# directory of its own: `e2e/cluster.sh tool NAME` prints the binary's path.
declare -A TOOL_MODULES=(
  [crane]=github.com/google/go-containerregistry/cmd/crane@v0.22.1
  [syft]=github.com/anchore/syft/cmd/syft@v1.57.2
  [helm-docs]=github.com/norwoodj/helm-docs/cmd/helm-docs@v1.14.2
  [actionlint]=github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
)
cmd_tool() {
  local name=${1:?tool name: ${!TOOL_MODULES[*]}}
  local module=${TOOL_MODULES[$name]:-}
  [[ -n $module ]] || die "unknown tool $name (one of: ${!TOOL_MODULES[*]})"
  local dir=$CACHE_ROOT/tools/$name-${module##*@}
  if [[ -x $dir/$name ]]; then
    echo "$dir/$name"
    return
  fi
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [[ ! -x $dir/$name ]]; then
    log "building $name ($module); once"
    local gobin buildlog start=$SECONDS
    gobin=$(mktemp -d)
    buildlog=$dir/build.log
    GOBIN=$gobin CGO_ENABLED=0 go install -trimpath "$module" >"$buildlog" 2>&1 \
      || { tail -30 "$buildlog" >&2; die "building $name failed (full log: $buildlog)"; }
    mv "$gobin/$name" "$dir/$name"; rmdir "$gobin"
    log "$name built in $((SECONDS - start))s, cached in $dir"
  fi
  echo "$dir/$name"
}

cmd_env() {
  echo "kubernetes=$K8S_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION coredns=$COREDNS_VERSION cache=$BIN_DIR"
}

case ${1:-} in
  build) cmd_build >/dev/null; echo "$BIN_DIR" ;;
  up) shift; cmd_up "$@" ;;
  import) shift; DIR=${1:?cluster directory}; shift; node_import "$@" ;;
  down) shift; cmd_down "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  env) cmd_env ;;
  promtool) cmd_promtool ;;
  tool) shift; cmd_tool "$@" ;;
  *) echo "usage: $0 build|up [--node] [DIR]|import DIR TAR...|down [DIR]|restart DIR COMPONENT|env|promtool" >&2; exit 2 ;;
esac
