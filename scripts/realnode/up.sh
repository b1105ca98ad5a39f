#!/usr/bin/env bash
# up.sh starts a real single-node Kubernetes on this machine, in one run dir (except
# what kubelet, containerd and kube-proxy hard-code, see down.sh):
#   etcd (loopback), kube-apiserver (on the pod bridge's address), kube-controller-manager,
#   kube-scheduler (--config DIR/kube-scheduler/config.yaml), containerd (CRI, NRI on at
#   its default socket /var/run/nri/nri.sock, runc with seccomp, overlayfs), a pod
#   network (the bridge understory0 with a free 10.217.N.0/24, Debian's bridge and
#   host-local CNI plugins), kube-proxy (iptables mode, Services 10.0.0.0/24), kubelet
#   (cgroupfs driver, cgroups per QoS, node name "localhost").
# It imports the pause and busybox images (OCI tars from build.sh) and any --import
# tarball, and waits for the node to be Ready and kube-proxy to have synced. On failure
# or Ctrl-C during start-up it tears everything down.
#
#   scripts/realnode/up.sh [-d DIR] [--owner-pid PID] [--import TAR]... [--insecure-registry HOST:PORT]...
#                          [--wait SECS] [-v N]
#     -d DIR          run dir (default: a new /tmp/understory-realnode.XXXXXX)
#     --owner-pid PID tear the node down (down.sh) as soon as PID exits: a test
#                     process that dies (Ctrl-C, timeout, kill -9) leaves nothing behind
#     --import TAR    also import this image tarball (e.g. bin/images/koordlet-nogpu.tar
#                     from `make images`) into containerd's k8s.io namespace
#     --insecure-registry HOST:PORT
#                     containerd pulls from this registry over plain HTTP (a hosts.toml
#                     in DIR/containerd/certs.d): a test's local registry
#     --wait SECS     when another node is live (or another agent's kubepods cgroups
#                     exist), wait up to SECS for it to end (default 0: fail at once)
#     -v N            kubelet's klog verbosity (default 2)
#     --control-plane-only NAME
#                     only etcd, the API server, the controller-manager and the
#                     scheduler on the bridge's address, and a node client certificate
#                     and kubeconfig (DIR/node.kubeconfig) for a node named NAME that
#                     joins from elsewhere: the cgroup v2 VM of test/e2e/nodev2, on a
#                     tap of the bridge. No containerd, kubelet or kube-proxy here.
# It prints the path of DIR/env, a shell file with KUBECONFIG, API_URL, CONTAINERD_ADDRESS,
# NRI_SOCKET, CTR, KUBECTL, POD_CIDR, SCHEDULER_CONFIG, the log paths and image names.
# Stop with
#   scripts/realnode/down.sh DIR
# Restart kubelet alone with scripts/realnode/kubelet.sh DIR restart; stop, start or
# restart another component (kube-apiserver, kube-scheduler, kube-proxy, ...) with
# scripts/realnode/ctl.sh DIR NAME stop|start|restart.
#
# Only one node runs on a machine at a time (kubepods cgroups, the bridge, the NRI
# socket and kube-proxy's iptables chains are machine-wide); up.sh refuses to start
# while another one is live, and cleans up what an aborted run left.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

dir= owner= verbosity=2 wait_secs=0 cp_only= node_name=localhost
imports=() insecure_registries=()
while [ $# -gt 0 ]; do
	case $1 in
	-d) dir=$2; shift 2 ;;
	--owner-pid) owner=$2; shift 2 ;;
	--import) imports+=("$2"); shift 2 ;;
	--insecure-registry) insecure_registries+=("$2"); shift 2 ;;
	--wait) wait_secs=$2; shift 2 ;;
	-v) verbosity=$2; shift 2 ;;
	--control-plane-only) cp_only=1 node_name=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1" ;;
	esac
done
[ "$(id -u)" = 0 ] || die "must run as root (kubelet and containerd manage cgroups and mounts)"
case $wait_secs in '' | *[!0-9]*) die "--wait needs a number of seconds, got '$wait_secs'" ;; esac
for t in "${imports[@]}"; do
	[ -f "$t" ] || die "--import $t: no such file (make images writes bin/images/*.tar)"
done
# What the pod network and kube-proxy need from the host (a missing one is named).
for c in ip iptables ip6tables ss curl openssl; do
	command -v $c >/dev/null || die "$c not found: install it (Debian: iproute2, iptables, curl, openssl)"
done

"$HERE/build.sh" >/dev/null
for p in bridge host-local loopback; do
	[ -x "$CNI_BIN_DIR/$p" ] || die "CNI plugin $CNI_BIN_DIR/$p missing: apt-get install containernetworking-plugins"
done

# One node per machine. A live one: wait (--wait) or fail; a dead one: clean it up.
other_live() {
	local p
	[ -f "$ACTIVE_FILE" ] || return 1
	other=$(cat "$ACTIVE_FILE")
	for p in "$other"/pids/*; do
		[ -f "$p" ] && pid_alive "$(cat "$p")" && return 0
	done
	return 1
}
# pod_cgroups: kubepods cgroups exist (another kubelet, or an agent in static mode).
pod_cgroups() {
	local h
	for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
		[ -d "$h" ] && { echo "$h"; return 0; }
	done
	return 1
}
wait_end=$((SECONDS + wait_secs))
while other_live; do
	[ $SECONDS -lt $wait_end ] || die "a real node is already running from $other (stop it: $HERE/down.sh $other)"
	log "waiting for the real node of $other to end (--wait $wait_secs)"
	sleep 5
done
if [ -f "$ACTIVE_FILE" ]; then
	other=$(cat "$ACTIVE_FILE")
	log "cleaning up the stale node of $other"
	"$HERE/down.sh" "$other" || true
	rm -f "$ACTIVE_FILE"
fi
# empty_leftover: the kubepods trees hold no process and no kubelet runs on this machine:
# what a killed test (or an agent in static mode, which creates kubepods/understory-batch)
# left behind.
empty_leftover() {
	local h c
	grep -qx kubelet /proc/[0-9]*/comm 2>/dev/null && return 1
	for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
		[ -d "$h" ] || continue
		while read -r c; do
			[ -s "$c" ] && return 1
		done < <(find "$h" -name cgroup.procs 2>/dev/null)
	done
	return 0
}
while h=$(pod_cgroups); do
	if empty_leftover; then
		log "removing the empty pod cgroups left behind ($h ...: no process in them, no kubelet running)"
		for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
			[ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
		done
		pod_cgroups >/dev/null || break
	fi
	[ $SECONDS -lt $wait_end ] || die "$h exists: another kubelet (or an agent in static mode) owns this machine's pod cgroups"
	log "waiting for $h to go (--wait $wait_secs)"
	sleep 5
done
# Leftovers of a run whose run dir is gone (down.sh could not run): the bridge, which
# only these scripts create, and a dead NRI socket.
if ip link show "$BRIDGE_NAME" >/dev/null 2>&1; then
	log "removing the bridge $BRIDGE_NAME an aborted run left"
	ip link delete "$BRIDGE_NAME" || die "cannot delete the stale bridge $BRIDGE_NAME"
	# That run's kube-proxy chains too (no other node runs: checked above).
	if iptables -w 5 -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
		log "removing the iptables chains of that run's kube-proxy (kube-proxy --cleanup)"
		timeout 60 "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
fi
if [ -S "$NRI_SOCKET_PATH" ]; then
	ss -Hxl | grep -qF " $NRI_SOCKET_PATH " &&
		die "$NRI_SOCKET_PATH is served by another runtime (containerd/CRI-O with NRI): stop it first"
	rm -f "$NRI_SOCKET_PATH"
fi
# kube-proxy's chains: another kube-proxy (or a leftover nobody owns) manages Services here.
if iptables -w 5 -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
	die "iptables chain nat/KUBE-SERVICES exists: another kube-proxy manages this machine's Services" \
		"(a leftover of an aborted run: $K8S_BIN/kube-proxy --cleanup)"
fi

if [ -z "$dir" ]; then
	dir=$(mktemp -d /tmp/understory-realnode.XXXXXX)
else
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
fi
# Unix socket paths must stay below 108 bytes.
[ ${#dir} -le 60 ] || die "run dir $dir is too long for unix socket paths (max 60 bytes)"
D=$dir
mkdir -p "$D"/{logs,pids,state,pki,cmd,cni/net.d,cni/ipam,nri/plugins,nri/conf.d,kube-scheduler,kube-proxy}
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
for p in /run/containerd /var/lib/kubelet /var/log/containers /var/log/pods /run/nri; do
	[ -e "$p" ] && echo "$p"
done >"$D/state/preexisting"
for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward net/bridge/bridge-nf-call-iptables; do
	[ -e /proc/sys/$k ] || continue
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
# Below the kernel's ephemeral range: a port in it may be taken, while its server is
# stopped (stage 8 of TestInstall stops kube-apiserver for 30 s), by an outgoing
# connection's local port (a client retrying the stopped server from this node's
# address can even connect to itself), and the restart then fails with "address
# already in use".
used=$(ss -Htan | awk '{print $4}' | sed 's/.*://' | sort -u)
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
[ "$ephemeral_low" -gt 12000 ] || die "ip_local_port_range starts at $ephemeral_low: no room below it for the node's ports"
port() {
	local p
	while :; do
		p=$((10000 + RANDOM % (ephemeral_low - 10000)))
		grep -qx "$p" <<<"$used" && continue
		used+=$'\n'$p
		echo "$p"
		return
	done
}
ETCD_PORT=$(port) ETCD_PEER=$(port) API_PORT=$(port) KUBELET_PORT=$(port) KUBELET_HEALTHZ=$(port)
SCHED_PORT=$(port) PROXY_HEALTHZ=$(port) PROXY_METRICS=$(port)

# --- pod network: a bridge with the first free /24 -------------------------------
# free_net N: no address of this machine and no route but the default one covers
# POD_NET_PREFIX.N.0/24.
free_net() {
	local n=$POD_NET_PREFIX.$1 r gw
	ip -4 -o addr show | grep -qF " $n." && return 1
	ip -4 route show table all | grep -q "^$n\." && return 1
	r=$(ip -4 -o route get "$n.1" 2>/dev/null) || return 0
	# Reached through the default route: nothing else uses it.
	gw=$(ip -4 route show default | awk 'NR == 1 {print $3}')
	[ -n "$gw" ] && case $r in *" via $gw "*) return 0 ;; esac
	return 1
}
net=
for i in $(seq "$POD_NET_FIRST" $((POD_NET_FIRST + 15))); do
	free_net "$i" && { net=$i; break; }
done
[ -n "$net" ] || die "no free /24 in $POD_NET_PREFIX.$POD_NET_FIRST-$((POD_NET_FIRST + 15)).0 for the pod network"
POD_CIDR=$POD_NET_PREFIX.$net.0/24
API_HOST=$POD_NET_PREFIX.$net.1
ip link add "$BRIDGE_NAME" type bridge
echo "$BRIDGE_NAME" >"$D/state/bridge"
ip addr add "$API_HOST/24" dev "$BRIDGE_NAME"
ip link set "$BRIDGE_NAME" up
API_URL=https://$API_HOST:$API_PORT

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
issue apiserver kube-apiserver "" "extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
subjectAltName=IP:127.0.0.1,IP:$API_HOST,IP:$SERVICE_API_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
issue admin understory-admin system:masters "$client"
issue node "system:node:$node_name" system:nodes "$client"
issue controller-manager system:kube-controller-manager "" "$client"
issue scheduler system:kube-scheduler "" "$client"
issue kube-proxy system:kube-proxy "" "$client"
ossl ecparam -name prime256v1 -genkey -noout -out "$P/sa.key"
ossl ec -in "$P/sa.key" -pubout -out "$P/sa.pub"
[ -s "$P/scheduler.crt" ] && [ -s "$P/sa.pub" ] || die "openssl failed to write the PKI in $P"

kubeconfig() {
	cat >"$D/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster: {server: "$API_URL", certificate-authority: "$P/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$P/$1.crt", client-key: "$P/$1.key"}
contexts:
- name: realnode
  context: {cluster: realnode, user: $1, namespace: default}
current-context: realnode
EOF
}
for u in admin node controller-manager scheduler kube-proxy; do kubeconfig $u; done

# start NAME CMD...: run CMD in its own session, logs in logs/NAME.log, pid in pids/NAME.
# The command is kept in cmd/NAME (a bash array), from which ctl.sh starts it again.
start() {
	local name=$1
	shift
	{
		printf 'CMD=('
		printf '%q ' "$@"
		printf ')\n'
	} >"$D/cmd/$name"
	setsid bash -c ". '$D/cmd/$name'; exec \"\${CMD[@]}\"" >"$D/logs/$name.log" 2>&1 </dev/null &
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
	--bind-address "$API_HOST" --advertise-address "$API_HOST" --secure-port "$API_PORT" \
	--cert-dir "$D/apiserver" --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
	--client-ca-file "$P/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
	--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$P/sa.pub" \
	--service-account-signing-key-file "$P/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
	--kubelet-client-certificate "$P/admin.crt" --kubelet-client-key "$P/admin.key" \
	--enable-priority-and-fairness=false --profiling=false
wait_for 90 kube-apiserver curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
	"$API_URL/readyz"

# --- controller-manager and scheduler -------------------------------------------
start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig "$D/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$D/controller-manager.kubeconfig" --authorization-kubeconfig "$D/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials=true \
	--service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
	--controllers '*,-nodeipam'
# The scheduler reads its configuration from a file, so that a test (or a user trying
# the extender by hand) rewrites it and restarts it: ctl.sh DIR kube-scheduler restart.
SCHEDULER_CONFIG=$D/kube-scheduler/config.yaml
cat >"$SCHEDULER_CONFIG" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$D/scheduler.kubeconfig"}
leaderElection: {leaderElect: false}
EOF
start kube-scheduler "$K8S_BIN/kube-scheduler" --config "$SCHEDULER_CONFIG" \
	--authentication-kubeconfig "$D/scheduler.kubeconfig" --authorization-kubeconfig "$D/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$SCHED_PORT"

# common_env: the env file's lines every run has; finish MSG: the watchdog, the log line
# and the env file's path, the end of a successful start.
common_env() {
	cat <<EOF
REALNODE_DIR=$D
KUBECONFIG=$D/admin.kubeconfig
API_URL=$API_URL
API_HOST=$API_HOST
CA_CERT=$P/ca.crt
ADMIN_CERT=$P/admin.crt
ADMIN_KEY=$P/admin.key
POD_CIDR=$POD_CIDR
BRIDGE=$BRIDGE_NAME
KUBECTL=$K8S_BIN/kubectl
NODE_NAME=$node_name
PAUSE_IMAGE=$PAUSE_IMAGE
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
EOF
}
finish() {
	if [ -n "$owner" ]; then
		setsid bash "$HERE/watchdog.sh" "$owner" "$D" >"$D/logs/watchdog.log" 2>&1 </dev/null &
		echo $! >"$D/pids/watchdog"
	fi
	ok=1
	log "$* in $((SECONDS - T0))s; run dir $D"
	echo "$D/env"
}

if [ -n "$cp_only" ]; then
	wait_for 60 "default service account" kubectl_ -n default get serviceaccount default
	{
		echo "# Written by scripts/realnode/up.sh --control-plane-only; stop with scripts/realnode/down.sh $D"
		common_env
		cat <<EOF
NODE_KUBECONFIG=$D/node.kubeconfig
NODE_CERT=$P/node.crt
NODE_KEY=$P/node.key
KUBE_PROXY_CERT=$P/kube-proxy.crt
KUBE_PROXY_KEY=$P/kube-proxy.key
SERVICE_CIDR=$SERVICE_CIDR
EOF
	} >"$D/env"
	finish "control plane up (API $API_URL, node $node_name may join)"
	exit 0
fi

# --- containerd (config v3, NRI on) ---------------------------------------------
C=$D/containerd
mkdir -p "$C"
CONTAINERD_ADDRESS=$C/containerd.sock
NRI_SOCKET=$NRI_SOCKET_PATH
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
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "$C/certs.d"

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
# Pods on the bridge (containerd sets up their loopback itself). isGateway stays off:
# the bridge already has its address. No masquerading: pods never leave the machine.
# A pod that calls a Service backed by another pod (the second scheduler calling the
# extender's ClusterIP) sends to the bridge's address, kube-proxy's DNAT turns it
# towards the other pod, and the host forwards it back onto the bridge: that needs
# net.ipv4.ip_forward, and the reply, bridged from pod to pod, must pass conntrack to be
# un-DNATed (net.bridge.bridge-nf-call-iptables, br_netfilter), as on every Kubernetes
# node. Both are on while the node runs; down.sh puts back what they were (state/sysctls).
echo 1 >/proc/sys/net/ipv4/ip_forward
if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null; then
	echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
else
	log "no br_netfilter (net.bridge.bridge-nf-call-iptables): pods cannot call Services backed by other pods"
fi
cat >"$D/cni/net.d/10-understory.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "understory-realnode", "plugins": [{
  "type": "bridge", "bridge": "$BRIDGE_NAME", "isGateway": false, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "dataDir": "$D/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}],
           "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$API_HOST", "rangeStart": "$POD_NET_PREFIX.$net.10"}]]}
}]}
EOF
for reg in "${insecure_registries[@]}"; do
	mkdir -p "$C/certs.d/$reg"
	printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' "$reg" "$reg" \
		>"$C/certs.d/$reg/hosts.toml"
done
start containerd "$RT_BIN/containerd" --config "$C/config.toml"
CTR=("$RT_BIN/ctr" --address "$CONTAINERD_ADDRESS" --namespace k8s.io)
wait_for 60 containerd "${CTR[@]}" version
wait_for 30 "NRI socket" test -S "$NRI_SOCKET"
for img in "$IMG_DIR/pause.tar" "$IMG_DIR/busybox.tar" "${imports[@]}"; do
	"${CTR[@]}" images import --snapshotter overlayfs "$img" >/dev/null || die "ctr images import $img failed"
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

# --- kube-proxy (iptables) ------------------------------------------------------
# Settings that would change the machine beyond its own chains are off: conntrack
# sizes and timeouts stay as they are (0), no route_localnet (localhostNodePorts),
# NodePorts only on the bridge's address. down.sh runs `kube-proxy --cleanup`.
cat >"$D/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$D/kube-proxy.kubeconfig"}
hostnameOverride: localhost
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ
metricsBindAddress: 127.0.0.1:$PROXY_METRICS
nodePortAddresses: ["$API_HOST/32"]
oomScoreAdj: 0
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
EOF
touch "$D/state/kube-proxy"
start kube-proxy "$K8S_BIN/kube-proxy" --config "$D/kube-proxy/config.yaml"
wait_for 60 "kube-proxy synced" curl -sf "http://127.0.0.1:$PROXY_HEALTHZ/healthz"
wait_for 30 "kube-proxy's rule for the kubernetes Service" \
	bash -c "iptables -w 5 -t nat -S KUBE-SERVICES | grep -q -- '-d $SERVICE_API_IP/32'"

{
	echo "# Written by scripts/realnode/up.sh; stop with scripts/realnode/down.sh $D"
	common_env
	cat <<EOF
SCHEDULER_CONFIG=$SCHEDULER_CONFIG
SCHEDULER_KUBECONFIG=$D/scheduler.kubeconfig
SCHEDULER_HEALTHZ=https://127.0.0.1:$SCHED_PORT/healthz
KUBE_PROXY_HEALTHZ=http://127.0.0.1:$PROXY_HEALTHZ/healthz
CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS
NRI_SOCKET=$NRI_SOCKET
CTR=$RT_BIN/ctr
KUBELET_ROOT=$K/root
KUBELET_HEALTHZ=http://127.0.0.1:$KUBELET_HEALTHZ/healthz
KUBELET_LOG=$D/logs/kubelet.log
CONTAINERD_LOG=$D/logs/containerd.log
EOF
} >"$D/env"
finish "node localhost Ready (pods $POD_CIDR on $BRIDGE_NAME, API $API_URL)"
