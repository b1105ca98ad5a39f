#!/usr/bin/env bash
# down.sh DIR [--purge]: tears down the node up.sh started in DIR. Idempotent, and
# safe on a half-started node. In order:
#   1. kubelet (SIGTERM, then SIGKILL), so nothing restarts pods;
#   2. every containerd task, container and pod sandbox in namespace k8s.io (ctr), then
#      any shim of this containerd still alive, by PID;
#   3. containerd, kube-proxy, the scheduler, the controller-manager, the apiserver,
#      etcd, the watchdog - each by the PID up.sh recorded;
#   4. any process still in this node's kubepods cgroups (SIGKILL, by PID);
#   5. every mount below DIR, deepest first;
#   6. the kubepods cgroups in every hierarchy, deepest first (the agent's tier too);
#   7. what kubelet, kube-proxy and the pod network change outside DIR: the kernel
#      tunables kubelet "fixes" (vm.overcommit_memory, kernel.panic, ...) are put back,
#      kubelet's iptables chains (KUBE-FIREWALL, KUBE-IPTABLES-HINT,
#      KUBE-KUBELET-CANARY) removed, kube-proxy's by `kube-proxy --cleanup`, the bridge
#      understory0 deleted, and the fixed paths /run/containerd, /run/nri,
#      /var/lib/kubelet (device-plugins), /var/log/containers and /var/log/pods removed
#      when they did not exist before up.sh.
# DIR's logs and configs stay (for post-mortems) unless --purge; the data dirs go.
# REALNODE_DEBUG=1 logs each step with its time.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[ $# -ge 1 ] || die "usage: down.sh DIR [--purge]"
D=$(cd "$1" 2>/dev/null && pwd) || { log "$1: no such run dir"; exit 0; }
purge=
[ "${2:-}" = --purge ] && purge=1
[ -d "$D/pids" ] || { log "$D is not a real-node run dir"; exit 1; }
# Ctrl-C must not stop a teardown half-way.
trap '' INT TERM HUP PIPE

dbg() { [ -z "${REALNODE_DEBUG:-}" ] || log "+${SECONDS}s $*"; }
owns_machine() { [ "$(cat "$ACTIVE_FILE" 2>/dev/null)" = "$D" ]; }

# stop NAME [GRACE]: SIGTERM the recorded PID, SIGKILL after GRACE seconds.
stop() {
	local f=$D/pids/$1 grace=${2:-10} pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	dbg "stopping $1"
	if [ "$pid" != "$PPID" ] && [ "$pid" != "$$" ] && pid_alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null
		local end=$((SECONDS + grace))
		while pid_alive "$pid" && [ $SECONDS -lt $end ]; do sleep 0.1; done
		if pid_alive "$pid"; then
			log "$1 ($pid) ignored SIGTERM for ${grace}s; SIGKILL"
			kill -KILL "$pid" 2>/dev/null
		fi
	fi
	rm -f "$f"
}

# 1. kubelet.
stop kubelet 15

# Cgroup hierarchies (v1 controllers and named hierarchies, plus cgroup2).
hierarchies() {
	awk '$9 == "cgroup" || $9 == "cgroup2" {print $5}' /proc/self/mountinfo 2>/dev/null ||
		awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts
}

# thaw_pods thaws every frozen pod cgroup of this node (v1 freezer.state, v2
# cgroup.freeze). The agent freezes batch while LS needs the CPU or the GPU and thaws
# it when it stops, but a SIGKILLed agent (step 2 kills every task) thaws nothing, and
# a frozen task neither dies from SIGKILL nor leaves its cgroup until thawed: teardown
# would wait for it forever and the next run would find kubepods still there.
thaw_pods() {
	local h f
	owns_machine || return 0
	for h in $(hierarchies); do
		[ -d "$h/kubepods" ] || continue
		while read -r f; do
			[ -n "$f" ] || continue
			case $f in
			*/freezer.state) [ "$(cat "$f" 2>/dev/null)" = THAWED ] || echo THAWED >"$f" 2>/dev/null ;;
			*/cgroup.freeze) [ "$(cat "$f" 2>/dev/null)" = 0 ] || echo 0 >"$f" 2>/dev/null ;;
			esac
		done < <(find "$h/kubepods" \( -name freezer.state -o -name cgroup.freeze \) 2>/dev/null)
	done
}

# 2. containers, through containerd while it still runs.
addr=$D/containerd/containerd.sock
ctr_() { timeout 20 "$RT_BIN/ctr" --address "$addr" --namespace k8s.io "$@"; }
if [ -S "$addr" ] && pid_alive "$(cat "$D/pids/containerd" 2>/dev/null)"; then
	dbg "killing tasks"
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1
	done
	thaw_pods # the agent is gone: nothing freezes them again
	dbg "deleting tasks"
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks delete -f "$id" >/dev/null 2>&1
	done
	# CRI pod sandboxes own their shim (and the pause task): removing them makes
	# the shims exit.
	dbg "removing sandboxes"
	for id in $(ctr_ sandboxes ls 2>/dev/null | awk 'NR > 1 {print $1}'); do
		ctr_ sandboxes remove -f "$id" >/dev/null 2>&1
	done
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks delete -f "$id" >/dev/null 2>&1
	done
	for id in $(ctr_ containers ls -q 2>/dev/null); do
		ctr_ containers delete "$id" >/dev/null 2>&1
	done
fi
# Shims outlive containerd: find this containerd's shims by their -address argument
# (unique to DIR). A shim exits by itself once its sandbox is gone; else SIGKILL.
shims() {
	local f pid
	for f in $(grep -l -a -F -e "$addr" /proc/[0-9]*/cmdline 2>/dev/null); do
		pid=${f#/proc/}
		pid=${pid%/cmdline}
		grep -q -a -F containerd-shim "$f" 2>/dev/null && echo "$pid"
	done
}
dbg "waiting for shims"
for _ in 1 2 3 4 5 6 7 8 9 10; do
	[ -n "$(shims)" ] || break
	sleep 0.2
done
for pid in $(shims); do
	dbg "killing leftover shim $pid"
	kill -KILL "$pid" 2>/dev/null
done

# 3. daemons.
stop containerd 10
stop kube-proxy 5
stop kube-scheduler 5
stop kube-controller-manager 5
stop kube-apiserver 3
stop etcd 10
stop watchdog 1

if owns_machine; then
	# 4. processes left in this node's pod cgroups (container processes of killed shims).
	for _ in 1 2 3; do
		left=
		thaw_pods
		for h in $(hierarchies); do
			[ -d "$h/kubepods" ] || continue
			while read -r pid; do
				[ -n "$pid" ] || continue
				left=1
				kill -KILL "$pid" 2>/dev/null
			done < <(find "$h/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null)
		done
		[ -n "$left" ] || break
		sleep 0.5
	done
fi

# 5. mounts below DIR, deepest first.
for _ in 1 2 3; do
	mps=$(awk -v d="$D/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
	[ -n "$mps" ] || break
	while read -r m; do
		# mountinfo escapes spaces as \040.
		m=$(printf '%b' "$m")
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
	done <<<"$mps"
done

if owns_machine; then
	# 6. kubepods cgroups, deepest first, in every hierarchy.
	for h in $(hierarchies); do
		[ -d "$h/kubepods" ] || continue
		for _ in 1 2 3 4 5; do
			find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
			[ -d "$h/kubepods" ] || break
			sleep 0.5
		done
		[ -d "$h/kubepods" ] && log "could not remove $h/kubepods: $(find "$h/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')"
	done

	# 7. what kubelet changes outside DIR.
	if [ -f "$D/state/sysctls" ]; then
		while read -r k v; do
			[ "$(cat "/proc/sys/$k" 2>/dev/null)" = "$v" ] || echo "$v" >"/proc/sys/$k" 2>/dev/null || log "cannot restore $k=$v"
		done <"$D/state/sysctls"
	fi
	if [ -f "$D/state/iptables-preexisting" ]; then
		for fam in iptables ip6tables; do
			command -v $fam >/dev/null || continue
			pre() { grep -qx "$fam $1" "$D/state/iptables-preexisting"; }
			if ! pre filter:KUBE-FIREWALL && $fam -w 5 -t filter -S KUBE-FIREWALL >/dev/null 2>&1; then
				while $fam -w 5 -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
				while $fam -w 5 -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
				$fam -w 5 -t filter -F KUBE-FIREWALL 2>/dev/null
				$fam -w 5 -t filter -X KUBE-FIREWALL 2>/dev/null
			fi
			for tc in mangle:KUBE-IPTABLES-HINT mangle:KUBE-KUBELET-CANARY nat:KUBE-KUBELET-CANARY filter:KUBE-KUBELET-CANARY; do
				pre "$tc" && continue
				$fam -w 5 -t "${tc%%:*}" -X "${tc#*:}" 2>/dev/null
			done
		done
	fi
	# kube-proxy's chains and rules (both families; also its nftables tables, were
	# there any): up.sh refuses to start where another kube-proxy had them.
	if [ -f "$D/state/kube-proxy" ] && [ -x "$K8S_BIN/kube-proxy" ]; then
		dbg "kube-proxy --cleanup"
		timeout 60 "$K8S_BIN/kube-proxy" --cleanup >"$D/logs/kube-proxy-cleanup.log" 2>&1 ||
			log "kube-proxy --cleanup failed (see $D/logs/kube-proxy-cleanup.log)"
		iptables -w 5 -t nat -S KUBE-SERVICES >/dev/null 2>&1 && log "kube-proxy's chains are still there after --cleanup"
		rm -f "$D/state/kube-proxy"
	fi
	if [ -f "$D/state/bridge" ]; then
		br=$(cat "$D/state/bridge")
		if ip link show "$br" >/dev/null 2>&1; then
			ip link delete "$br" 2>/dev/null || log "cannot delete the bridge $br"
		fi
		rm -f "$D/state/bridge"
	fi
	if [ -f "$D/state/preexisting" ]; then
		for p in /run/containerd /var/lib/kubelet /var/log/containers /var/log/pods /run/nri; do
			grep -qx "$p" "$D/state/preexisting" && continue
			[ -e "$p" ] || continue
			if grep -q " $p/\| $p " /proc/self/mountinfo; then
				log "not removing $p: something is mounted there"
				continue
			fi
			rm -rf "$p"
		done
	fi
	rm -f "$ACTIVE_FILE"
fi

# Data dirs (logs and configs stay unless --purge).
rm -rf "$D/containerd/root" "$D/containerd/state" "$D/containerd/runc" "$D/kubelet/root" "$D/etcd" 2>/dev/null ||
	log "some data under $D could not be removed"
rm -f "$D/env"
[ -z "$purge" ] || rm -rf "$D"
log "torn down $D"
exit 0
