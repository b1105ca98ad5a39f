#!/usr/bin/env bash
# kubelet.sh DIR stop|start|restart: stop (SIGTERM, then SIGKILL after 15 s) and/or
# start the kubelet of the node up.sh started in DIR, with the same command line. Its
# log is appended to DIR/logs/kubelet.log. start waits for kubelet's /healthz and for
# the node to be Ready in a status this kubelet posted; it fails as soon as kubelet exits.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[ $# -eq 2 ] || die "usage: kubelet.sh DIR stop|start|restart"
D=$1 what=$2
[ -f "$D/env" ] || die "$D has no running node (no $D/env)"
# shellcheck disable=SC1091
. "$D/env"

stop() {
	local pid
	pid=$(cat "$D/pids/kubelet" 2>/dev/null || true)
	pid_alive "$pid" || return 0
	kill -TERM "$pid"
	local end=$((SECONDS + 15))
	while pid_alive "$pid" && [ $SECONDS -lt $end ]; do sleep 0.1; done
	pid_alive "$pid" && kill -KILL "$pid"
	while pid_alive "$pid"; do sleep 0.1; done
}
# ready_since T: the node is Ready in a status posted at or after unix time T (so by
# this kubelet, after its container manager started: kubelet reports Ready only then).
ready_since() {
	local out hb st
	out=$("$KUBECTL" --kubeconfig "$KUBECONFIG" get node "$NODE_NAME" \
		-o 'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
	st=${out%% *} hb=${out#* }
	[ "$st" = True ] && [ "$(date -d "$hb" +%s 2>/dev/null || echo 0)" -ge "$1" ]
}
start() {
	pid_alive "$(cat "$D/pids/kubelet" 2>/dev/null || true)" && die "kubelet already running"
	local t0
	t0=$(date -u +%s)
	echo "=== kubelet.sh start at $(date -u +%FT%T.%3NZ)" >>"$D/logs/kubelet.log"
	setsid bash -c ". '$D/kubelet/cmd'; exec \"\${KUBELET_CMD[@]}\"" >>"$D/logs/kubelet.log" 2>&1 </dev/null &
	echo $! >"$D/pids/kubelet"
	# /healthz answers before the container manager starts (and possibly fails, e.g. on
	# kubelet's QoS cgroups); wait for the node to be Ready as reported by this kubelet.
	local pid end=$((SECONDS + 60))
	pid=$(cat "$D/pids/kubelet")
	until curl -sf "$KUBELET_HEALTHZ" >/dev/null 2>&1 && ready_since "$t0"; do
		pid_alive "$pid" || die "kubelet exited during start-up (see $D/logs/kubelet.log)"
		[ $SECONDS -lt $end ] || die "kubelet not healthy and Ready after 60s (see $D/logs/kubelet.log)"
		sleep 0.2
	done
}
case $what in
stop) stop ;;
start) start ;;
restart) stop; start ;;
*) die "usage: kubelet.sh DIR stop|start|restart" ;;
esac
