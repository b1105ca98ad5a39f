#!/usr/bin/env bash
# up.sh starts a real single-node Kubernetes on this machine, everything on loopback
# and (except what kubelet and containerd hard-code, see down.sh) in one run dir:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (CRI,
#   NRI on, runc with seccomp, overlayfs, loopback CNI), kubelet (cgroupfs driver,
#   cgroups per QoS, node name "localhost").
# It imports the pause and busybox images (OCI tars from build.sh) and waits for the
# node to be Ready. On failure or Ctrl-C during start-up it tears everything down.
#
#   scripts/realnode/up.sh [-d DIR] [--owner-pid PID] [-v N]
#     -d DIR          run dir (default: a new /tmp/understory-realnode.XXXXXX)
#     --owner-pid PID tear the node down (down.sh) as soon as PID exits: a test
#                     process that dies (Ctrl-C, timeout, kill -9) leaves nothing behind
#     -v N            kubelet's klog verbosity (default 2)
# It prints the path of DIR/env, a shell file with KUBECONFIG, CONTAINERD_ADDRESS,
# NRI_SOCKET, CTR, KUBECTL, the log paths and image names. Stop with
#   scripts/realnode/down.sh DIR
# Restart kubelet alone with scripts/realnode/kubelet.sh DIR restart.
#
# Only one node runs on a machine at a time (kubepods cgroups are machine-wide);
# up.sh refuses to start while another one is live.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

dir= owner= verbosity=2
while [ $# -gt 0 ]; do
	case $1 in
	-d) dir=$2; shift 2 ;;
	--owner-pid) owner=$2; shift 2 ;;
	-v) verbosity=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1" ;;
	esac
done
[ "$(id -u)" = 0 ] || die "must run as root (kubelet and containerd manage cgroups and mounts)"

"$HERE/build.sh" >/dev/null

# One node per machine.
if [ -f "$ACTIVE_FILE" ]; then
	other=$(cat "$ACTIVE_FILE")
	live=
	for p in "$other"/pids/*; do
		[ -f "$p" ] && pid_alive "$(cat "$p")" && live=1
	done
	[ -z "$live" ] || die "a real node is already running from $other (stop it: $HERE/down.sh $other)"
	log "cleaning up the stale node of $other"
	"$HERE/down.sh" "$other" || true
fi
for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
	[ ! -d "$h" ] || die "$h exists: another kubelet owns this machine's pod cgroups"
done

if [ -z "$dir" ]; then
	dir=$(mktemp -d /tmp/understory-realnode.XXXXXX)
else
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
fi
# Unix socket paths must stay below 108 bytes.
[ ${#dir} -le 60 ] || die "run dir $dir is too long for unix socket paths (max 60 bytes)"
D=$dir
mkdir -p "$D"/{logs,pids,state,pki,cni/net.d,nri/plugins,nri/conf.d}
echo "$D" >"$ACTIVE_FILE"

ok=
on_exit() {
	[ -n "$ok" ] && return
	log "start-up failed; last lines of the logs:"
	for f in "$D"/logs/*.log; do
		[ -f "$f" ] || continue
		echo "--- $f" >&2
		tail -n 15 "$f" >&2
	done
	"$HERE/down.sh" "$D" || true
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- what exists before we start, so down.sh removes only what we created --------
for p in /run/containerd /var/lib/kubelet /var/log/containers /var/log/pods; do
	[ -e "$p" ] && echo "$p"
done >"$D/state/preexisting"
for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
	echo "$k $(cat /proc/sys/$k)"
done >"$D/state/sysctls"
{
	for fam in iptables ip6tables; do
		command -v $fam >/dev/null || continue
		for tc in mangle:KUBE-IPTABLES-HINT filter:KUBE-FIREWALL mangle:KUBE-KUBELET-CANARY nat:KUBE-KUBELET-CANARY filter:KUBE-KUBELET-CANARY; do
			$fam -w 5 -t "${tc%%:*}" -S "${tc#*:}" >/dev/null 2>&1 && echo "$fam $tc"
		done
	done
} >"$D/state/iptables-preexisting" || true

# --- ports ----------------------------------------------------------------------
used=$(ss -Htan | awk '{print $4}' | sed 's/.*://' | sort -u)
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 25000))
		grep -qx "$p" <<<"$used" && continue
		used+=$'\n'$p
		echo "$p"
		return
	done
}
ETCD_PORT=$(port) ETCD_PEER=$(port) API_PORT=$(port) KUBELET_PORT=$(port) KUBELET_HEALTHZ=$(port)

# --- PKI (ECDSA P-256, valid 2 days) ---------------------------------------------
P=$D/pki
ossl() { openssl "$@" >/dev/null 2>&1; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" \
	-days 2 -subj /CN=understory-realnode-ca
# issue NAME CN ORG EXT: a certificate signed by the CA.
issue() {
	local name=$1 cn=$2 org=$3 ext=$4
	ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$P/$name.key" -out "$P/$name.csr" \
		-subj "/CN=$cn${org:+/O=$org}"
	printf '%s\n' "$ext" >"$P/$name.ext"
	ossl x509 -req -in "$P/$name.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 2 \
		-out "$P/$name.crt" -extfile "$P/$name.ext"
}
client='extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature'
issue apiserver kube-apiserver "" 'extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc'
issue admin understory-admin system:masters "$client"
issue node system:node:localhost system:nodes "$client"
issue controller-manager system:kube-controller-manager "" "$client"
issue scheduler system:kube-scheduler "" "$client"
ossl ecparam -name prime256v1 -genkey -noout -out "$P/sa.key"
ossl ec -in "$P/sa.key" -pubout -out "$P/sa.pub"
[ -s "$P/scheduler.crt" ] && [ -s "$P/sa.pub" ] || die "openssl failed to write the PKI in $P"

kubeconfig() {
	cat >"$D/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$P/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}
contexts:
- name: realnode
  context: {cluster: realnode, user: $1, namespace: default}
current-context: realnode
EOF
}
for u in admin node controller-manager scheduler; do kubeconfig $u; done

# start NAME CMD...: run CMD in its own session, logs in logs/NAME.log, pid in pids/NAME.
start() {
	local name=$1
	shift
	setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$D/pids/$name"
}
export PATH=$RT_BIN:$RUNC_BIN:$K8S_BIN:$PATH
kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$D/admin.kubeconfig" "$@"; }
T0=$SECONDS

# --- etcd -----------------------------------------------------------------------
start etcd etcd --name realnode --data-dir "$D/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
	--initial-cluster "realnode=http://127.0.0.1:$ETCD_PEER" --unsafe-no-fsync
wait_for 60 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver -------------------------------------------------------------
start kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
	--cert-dir "$D/apiserver" --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
	--client-ca-file "$P/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
	--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$P/sa.pub" \
	--service-account-signing-key-file "$P/sa.key" --service-cluster-ip-range 10.0.0.0/24 \
	--kubelet-client-certificate "$P/admin.crt" --kubelet-client-key "$P/admin.key" \
	--enable-priority-and-fairness=false --profiling=false
wait_for 90 kube-apiserver curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
	"https://127.0.0.1:$API_PORT/readyz"

# --- controller-manager and scheduler -------------------------------------------
start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig "$D/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$D/controller-manager.kubeconfig" --authorization-kubeconfig "$D/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials=true \
	--service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
	--controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle-controller,-node-route-controller'
start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig "$D/scheduler.kubeconfig" \
	--authentication-kubeconfig "$D/scheduler.kubeconfig" --authorization-kubeconfig "$D/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false

# --- containerd (config v3, NRI on) ---------------------------------------------
C=$D/containerd
mkdir -p "$C"
CONTAINERD_ADDRESS=$C/containerd.sock
NRI_SOCKET=$D/nri/nri.sock
cat >"$C/config.toml" <<EOF
version = 3
root = "$C/root"
state = "$C/state"

[grpc]
  address = "$CONTAINERD_ADDRESS"
[ttrpc]
  address = "$CONTAINERD_ADDRESS.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "$C/image-verifier"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "$NRI_SOCKET"
  plugin_path = "$D/nri/plugins"
  plugin_config_path = "$D/nri/conf.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_cdi = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN_DIR"]
    conf_dir = "$D/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$RUNC_BIN/runc"
        Root = "$C/runc"
        SystemdCgroup = false
EOF
cat >"$D/cni/net.d/10-loopback.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "realnode-lo", "plugins": [{"type": "loopback"}]}
EOF
start containerd "$RT_BIN/containerd" --config "$C/config.toml"
CTR=("$RT_BIN/ctr" --address "$CONTAINERD_ADDRESS" --namespace k8s.io)
wait_for 60 containerd "${CTR[@]}" version
wait_for 30 "NRI socket" test -S "$NRI_SOCKET"
for img in pause busybox; do
	"${CTR[@]}" images import --snapshotter overlayfs "$IMG_DIR/$img.tar" >/dev/null
done

# --- kubelet --------------------------------------------------------------------
K=$D/kubelet
mkdir -p "$K/root" "$K/pod-logs"
cat >"$K/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_ADDRESS
address: 127.0.0.1
port: $KUBELET_PORT
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
readOnlyPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
podLogsDir: $K/pod-logs
staticPodPath: ""
resolvConf: ""
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerNode: true
EOF
cat >"$K/cmd" <<EOF
KUBELET_CMD=("$K8S_BIN/kubelet" --config "$K/config.yaml" --kubeconfig "$D/node.kubeconfig" --root-dir "$K/root" --cert-dir "$K/pki" --hostname-override localhost -v $verbosity)
EOF
start kubelet bash -c ". '$K/cmd'; exec \"\${KUBELET_CMD[@]}\""
node_ready() {
	[ "$(kubectl_ get node localhost -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
wait_for 120 "node localhost Ready" node_ready
# Pods of the default namespace need their service account (controller-manager).
wait_for 60 "default service account" kubectl_ -n default get serviceaccount default

cat >"$D/env" <<EOF
# Written by scripts/realnode/up.sh; stop with scripts/realnode/down.sh $D
REALNODE_DIR=$D
KUBECONFIG=$D/admin.kubeconfig
API_URL=https://127.0.0.1:$API_PORT
CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS
NRI_SOCKET=$NRI_SOCKET
CTR=$RT_BIN/ctr
KUBECTL=$K8S_BIN/kubectl
KUBELET_ROOT=$K/root
KUBELET_HEALTHZ=http://127.0.0.1:$KUBELET_HEALTHZ/healthz
KUBELET_LOG=$D/logs/kubelet.log
CONTAINERD_LOG=$D/logs/containerd.log
NODE_NAME=localhost
PAUSE_IMAGE=$PAUSE_IMAGE
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
EOF

if [ -n "$owner" ]; then
	setsid bash "$HERE/watchdog.sh" "$owner" "$D" >"$D/logs/watchdog.log" 2>&1 </dev/null &
	echo $! >"$D/pids/watchdog"
fi
ok=1
log "node localhost Ready in $((SECONDS - T0))s; run dir $D"
echo "$D/env"
