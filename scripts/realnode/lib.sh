# shellcheck shell=bash
# lib.sh: versions, cache paths and helpers shared by the real-node scripts.
# Sourced, never run.

CONTAINERD_VERSION=v2.1.4
RUNC_VERSION=v1.3.0

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# One Kubernetes version for the harness and the node: scripts/k8s-binaries.sh's.
K8S_VERSION=$(sed -n 's/^K8S_VERSION=//p' "$REPO_ROOT/scripts/k8s-binaries.sh")
CACHE_ROOT=${UNDERSTORY_CACHE:-$HOME/.cache/understory}
RT_WORK=$CACHE_ROOT/containerd-$CONTAINERD_VERSION
RT_BIN=$RT_WORK/bin
RUNC_WORK=$CACHE_ROOT/runc-$RUNC_VERSION
RUNC_BIN=$RUNC_WORK/bin
IMG_DIR=$CACHE_ROOT/realnode-images
K8S_BIN=${UNDERSTORY_K8S_BIN:-$CACHE_ROOT/k8s-$K8S_VERSION/bin}
CNI_BIN_DIR=/usr/lib/cni

# Image names as containerd knows them; pods use imagePullPolicy: Never.
PAUSE_IMAGE=understory.local/pause:realnode
BUSYBOX_IMAGE=understory.local/busybox:realnode

# containerd serves NRI at its default socket, which is where a DaemonSet on a real
# node finds it (manifests/koordlet: hostPath /var/run/nri). up.sh refuses to start
# while another runtime serves it.
NRI_SOCKET_PATH=/var/run/nri/nri.sock

# The pod network: a Linux bridge that up.sh creates with the first free /24 of
# POD_NET_PREFIX.N.0 (N from POD_NET_FIRST up) as the pod CIDR and .1 on the bridge; the
# API server listens there, so pods reach it (through kube-proxy's rules for the
# kubernetes Service) and so does everything on the host. Debian's bridge and
# host-local CNI plugins attach the pods. Services: SERVICE_CIDR, kube-proxy (iptables).
BRIDGE_NAME=understory0
POD_NET_PREFIX=10.217
POD_NET_FIRST=0
SERVICE_CIDR=10.0.0.0/24
SERVICE_API_IP=10.0.0.1

# The node is machine-wide (kubepods cgroups, /run/containerd/s, /var/lib/kubelet/...):
# only one may run at a time. This file names the run dir of the live node.
ACTIVE_FILE=/run/understory-realnode.active

log() { echo "realnode: $*" >&2; }
die() { log "$*"; exit 1; }

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
	local st
	[ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[ "$st" != Z ]
}

# wait_for SECONDS DESCRIPTION CMD...: retry CMD every 0.2 s until it succeeds.
wait_for() {
	local secs=$1 what=$2
	shift 2
	local end=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $end ] || { log "timed out after ${secs}s waiting for $what"; return 1; }
		sleep 0.2
	done
}
