#!/usr/bin/env bash
# ctl.sh DIR NAME stop|start|restart: stop (SIGTERM, then SIGKILL after a grace) and/or
# start one daemon of the node up.sh started in DIR, with the command line up.sh used
# (DIR/cmd/NAME). NAME is kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy or etcd (kubelet: kubelet.sh; containerd is not restarted alone). The log
# is appended to DIR/logs/NAME.log. start returns once the daemon is healthy:
#   kube-apiserver   /readyz answers ok
#   kube-scheduler   /healthz answers ok (it re-reads DIR/kube-scheduler/config.yaml)
#   kube-proxy       /healthz answers ok (it has synced its rules)
#   others           still running after 2 s
# and fails as soon as the daemon exits.
#
#   scripts/realnode/ctl.sh /tmp/rn-x kube-apiserver stop     # an API server outage
#   scripts/realnode/ctl.sh /tmp/rn-x kube-apiserver start
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
usage="usage: ctl.sh DIR kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|etcd stop|start|restart"
[ $# -eq 3 ] || die "$usage"
D=$1 name=$2 what=$3
case $name in
kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | etcd) ;;
kubelet) die "restart kubelet with $HERE/kubelet.sh $D $what" ;;
*) die "$usage" ;;
esac
[ -f "$D/env" ] || die "$D has no running node (no $D/env)"
[ -f "$D/cmd/$name" ] || die "$D/cmd/$name missing: the node in $D was started by an older up.sh"
# shellcheck disable=SC1091
. "$D/env"

stop() {
	local pid end
	pid=$(cat "$D/pids/$name" 2>/dev/null || true)
	pid_alive "$pid" || return 0
	kill -TERM "$pid"
	end=$((SECONDS + 15))
	while pid_alive "$pid" && [ $SECONDS -lt $end ]; do sleep 0.1; done
	if pid_alive "$pid"; then
		log "$name ($pid) ignored SIGTERM for 15s; SIGKILL"
		kill -KILL "$pid"
	fi
	while pid_alive "$pid"; do sleep 0.1; done
}

healthy() {
	case $name in
	kube-apiserver) curl -sf --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY" "$API_URL/readyz" ;;
	# Loopback, its own serving certificate: nothing to verify it against.
	kube-scheduler) curl -sfk "$SCHEDULER_HEALTHZ" ;;
	kube-proxy) curl -sf "$KUBE_PROXY_HEALTHZ" ;;
	*) return 0 ;;
	esac
}

start() {
	local pid end
	pid_alive "$(cat "$D/pids/$name" 2>/dev/null || true)" && die "$name already running"
	echo "=== ctl.sh start at $(date -u +%FT%T.%3NZ)" >>"$D/logs/$name.log"
	setsid bash -c ". '$D/cmd/$name'; exec \"\${CMD[@]}\"" >>"$D/logs/$name.log" 2>&1 </dev/null &
	pid=$!
	echo $pid >"$D/pids/$name"
	end=$((SECONDS + 90))
	sleep 0.2
	until healthy >/dev/null 2>&1; do
		pid_alive "$pid" || die "$name exited during start-up (see $D/logs/$name.log)"
		[ $SECONDS -lt $end ] || die "$name not healthy after 90s (see $D/logs/$name.log)"
		sleep 0.2
	done
	case $name in
	kube-apiserver | kube-scheduler | kube-proxy) ;;
	*)
		sleep 2
		pid_alive "$pid" || die "$name exited during start-up (see $D/logs/$name.log)"
		;;
	esac
}

case $what in
stop) stop ;;
start) start ;;
restart) stop; start ;;
*) die "$usage" ;;
esac
