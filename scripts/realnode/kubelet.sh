#!/usr/bin/env bash
# kubelet.sh DIR stop|start|restart: stop (SIGTERM, then SIGKILL after 15 s) and/or
# start the kubelet of the node up.sh started in DIR, with the same command line. Its
# log is appended to DIR/logs/kubelet.log. start waits for kubelet's /healthz.
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
start() {
	pid_alive "$(cat "$D/pids/kubelet" 2>/dev/null || true)" && die "kubelet already running"
	echo "=== kubelet.sh start at $(date -u +%FT%T.%3NZ)" >>"$D/logs/kubelet.log"
	setsid bash -c ". '$D/kubelet/cmd'; exec \"\${KUBELET_CMD[@]}\"" >>"$D/logs/kubelet.log" 2>&1 </dev/null &
	echo $! >"$D/pids/kubelet"
	local pid end=$((SECONDS + 60))
	pid=$(cat "$D/pids/kubelet")
	until curl -sf "$KUBELET_HEALTHZ" >/dev/null 2>&1; do
		pid_alive "$pid" || die "kubelet exited during start-up (see $D/logs/kubelet.log)"
		[ $SECONDS -lt $end ] || die "kubelet not healthy after 60s (see $D/logs/kubelet.log)"
		sleep 0.2
	done
}
case $what in
stop) stop ;;
start) start ;;
restart) stop; start ;;
*) die "usage: kubelet.sh DIR stop|start|restart" ;;
esac
