# The harness's real node: containerd (Debian's, with runc), a kubelet and kube-proxy built at
# the pinned release, pod networking from the CNI plugins (a bridge and host-local addresses).
# Sourced by e2e/cluster.sh (`up --node`, `down`, `import`); not run on its own.
#
# One real node per machine at a time: kube-proxy's iptables rules, the bridge and the cgroups
# are the host's, not a cluster directory's. The node is tainted `arbiter.dev/real-node` so
# only pods that tolerate it land there; the kwok node keeps everything else.

NODE_NAME=arbiter-node
NODE_BRIDGE=arbiter0
NODE_POD_CIDR=10.217.0.0/24
# The bridge's address: pods' default gateway, and where they reach the API server (it is the
# `kubernetes` Service's endpoint when the node runs).
NODE_GATEWAY=10.217.0.1
NODE_OWNER=/run/arbiter-e2e-node
NODE_TAINT=arbiter.dev/real-node
# The harness's images, imported into the node's containerd by `up --node`.
PAUSE_IMAGE=arbiter-e2e/pause:1
BUSYBOX_IMAGE=arbiter-e2e/busybox:1

node_tools_check() {
  local t missing=()
  for t in containerd containerd-shim-runc-v2 runc ctr ip iptables musl-gcc; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || missing+=(containernetworking-plugins)
  [[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -x httpd >/dev/null || missing+=(busybox-static)
  ((${#missing[@]} == 0)) || die "the real node needs ${missing[*]} (make setup installs them)"
}

# The node's images: the sandbox (pause, static with musl) and busybox for test workloads.
node_build_images() {
  local out=$1
  mkdir -p "$out/pause"
  musl-gcc -static -Os -s -o "$out/pause/pause" "$E2E_DIR/images/pause.c" \
    || die "building the pause program with musl-gcc failed"
  python3 "$E2E_DIR/images/build_image.py" --tag "$PAUSE_IMAGE" --out "$out/pause.tar" \
    --add /pause="$out/pause/pause" --entrypoint '["/pause"]' --user 65535:65535
  local links=() applet
  for applet in $(/bin/busybox --list); do
    [[ $applet == busybox ]] || links+=(--link "/bin/$applet=busybox")
  done
  python3 "$E2E_DIR/images/build_image.py" --tag "$BUSYBOX_IMAGE" --out "$out/busybox.tar" \
    --add /bin/busybox=/bin/busybox "${links[@]}" --entrypoint '["/bin/sh"]'
}

node_import() {
  local sock=$DIR/node/containerd.sock tar
  for tar in "$@"; do
    ctr --address "$sock" -n k8s.io images import --no-unpack=false "$tar" >>"$DIR/logs/images.log" 2>&1 \
      || { tail -5 "$DIR/logs/images.log" >&2; die "importing $tar into the node's containerd failed"; }
  done
}

node_claim() {
  if [[ -f $NODE_OWNER ]]; then
    local other; other=$(cat "$NODE_OWNER")
    # Only a live kubelet counts: a run killed before `down` leaves its directory and pids behind.
    local pid; pid=$(awk '$1 == "kubelet" {print $2}' "$other/pids" 2>/dev/null)
    if [[ -d $other && $other != "$DIR" && -n $pid ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == kubelet ]]; then
      die "another harness cluster ($other) runs the machine's real node; stop it first (e2e/cluster.sh down $other)"
    fi
  fi
  echo "$DIR" >"$NODE_OWNER"
}

node_up() {
  local bin=$1 kubelet_port=$2 proxy_healthz=$3 proxy_metrics=$4
  node_tools_check
  node_claim
  local n=$DIR/node
  mkdir -p "$n/cni" "$n/cni-ipam" "$n/images" "$n/kubelet" "$n/containerd"

  # The bridge exists before the first pod so the API server's advertised address is local.
  ip link del "$NODE_BRIDGE" 2>/dev/null || true
  ip link add "$NODE_BRIDGE" type bridge && ip addr add "$NODE_GATEWAY/24" dev "$NODE_BRIDGE" \
    && ip link set "$NODE_BRIDGE" up || die "creating the bridge $NODE_BRIDGE failed"
  echo 1 >/proc/sys/net/ipv4/ip_forward

  cat >"$n/cni/10-arbiter-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "arbiter-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$NODE_GATEWAY"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$n/cni-ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$n/containerd.toml" <<EOF
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd.sock"
[ttrpc]
  address = "$n/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$PAUSE_IMAGE"
  # Required here: the CRI asks for oom_score_adj -998 and the machine lacks CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$n/runc"
  # Registries the tests push to (e2e/tests/support/registry.rs) are trusted here, per host.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$n/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$n/cni"
EOF
  log "starting containerd (real node)"
  start containerd containerd --config "$n/containerd.toml"
  wait_for "containerd" containerd 30 ctr --address "$n/containerd.sock" version
  node_build_images "$n/images"
  node_import "$n/images/pause.tar" "$n/images/busybox.tar"

  # What differs by minor (the Kubernetes release under test: KUBE_VERSION, e2e/cluster.sh).
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local pull_policy=""
  # The harness imports its images (no registry): the kubelet must not ask for proof that a pod
  # may pull them. Without this, once a test pulled the same image from the local registry, the
  # kubelet counted it as that registry's and refused it to pods naming it otherwise. (Before
  # 1.35 the check is behind a feature gate that is off, and the field is refused.)
  ((minor >= 35)) && pull_policy="imagePullCredentialsVerificationPolicy: NeverVerify"
  cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 only; kubelets from 1.35 refuse it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
localStorageCapacityIsolation: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
address: $NODE_GATEWAY
port: $kubelet_port
readOnlyPort: 0
healthzPort: 0
clusterDomain: cluster.local
clusterDNS: [$NODE_GATEWAY]
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
$pull_policy
serializeImagePulls: false
registerWithTaints:
- {key: $NODE_TAINT, value: "true", effect: NoSchedule}
EOF
  log "starting kubelet (node $NODE_NAME) and kube-proxy"
  start kubelet "$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$DIR/kubeconfig" \
    --container-runtime-endpoint "unix://$n/containerd.sock" --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_GATEWAY" --node-labels "type=real,$NODE_TAINT=true" \
    --root-dir "$n/kubelet" --cert-dir "$n/kubelet/pki"

  cat >"$n/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $DIR/kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $NODE_POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$proxy_healthz
metricsBindAddress: 127.0.0.1:$proxy_metrics
# Pods on one bridge reach each other through Service IPs only if replies come back through
# the host: masquerade everything that is load-balanced.
iptables: {masqueradeAll: true, localhostNodePorts: false}
nodePortAddresses: [primary]
conntrack: {maxPerCore: 0}
EOF
  start kube-proxy "$bin/kube-proxy" --config "$n/kube-proxy.yaml" -v 2

  # Cluster DNS for pods: CoreDNS on the bridge's address, answering for cluster.local only
  # (nothing is forwarded: the machine has no resolver to forward to).
  cat >"$n/Corefile" <<EOF
.:53 {
    bind $NODE_GATEWAY
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/kubeconfig arbiter-e2e
        pods insecure
    }
    cache 5
}
EOF
  start coredns "$bin/coredns" -conf "$n/Corefile"

  local k=(kubectl --kubeconfig "$DIR/kubeconfig")
  wait_for "node $NODE_NAME to be Ready" kubelet 120 \
    "${k[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
  check_alive kube-proxy
  check_alive coredns
}

# Stop what the node runs, then the node: every container (so no workload outlives the
# cluster), the kubelet and kube-proxy (by the caller's pid loop), containerd; then undo the
# host changes: kube-proxy's rules, mounts under the cluster directory, the bridge.
node_down_containers() {
  local dir=$1 n=$1/node
  [[ -S $n/containerd.sock ]] || return 0
  local c=(ctr --address "$n/containerd.sock" -n k8s.io) id
  for id in $("${c[@]}" tasks ls -q 2>/dev/null); do
    "${c[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
}

node_down_host() {
  local dir=$1 bin=$2
  [[ -d $dir/node ]] || return 0
  # containerd's shims are not in the pids file; they name the node's socket.
  pkill -KILL -f -- "-address $dir/node/containerd.sock" 2>/dev/null || true
  [[ -x $bin/kube-proxy ]] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done \
    < <(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r)
  if [[ $(cat "$NODE_OWNER" 2>/dev/null) == "$dir" ]]; then
    node_remove_kube_chains
    ip link del "$NODE_BRIDGE" 2>/dev/null || true
    rm -f "$NODE_OWNER"
  fi
}

# What `kube-proxy --cleanup` leaves: the kubelet's own chains (KUBE-FIREWALL,
# KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and the rules jumping to them.
node_remove_kube_chains() {
  local table rule chain
  for table in filter nat mangle; do
    while read -r rule; do
      # shellcheck disable=SC2086 # the saved rule's words are iptables arguments
      iptables -t "$table" ${rule/-A /-D } 2>/dev/null || true
    done < <(iptables-save -t "$table" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' || true)
    while read -r chain; do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done < <(iptables-save -t "$table" 2>/dev/null | awk '/^:KUBE-/ {print substr($1, 2)}')
  done
}
