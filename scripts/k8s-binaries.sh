#!/usr/bin/env bash
# k8s-binaries.sh builds the Kubernetes control-plane binaries that the
# integration tests and benchmarks under test/e2e run, and installs etcd.
#
# The binaries are built from the Go module proxy (no git clone, no release
# download) in a throwaway module kept in a cache directory OUTSIDE the repo,
# and are reused on the next run when their --version matches.
#
#   scripts/k8s-binaries.sh                 # kube-apiserver + kube-scheduler (default)
#   scripts/k8s-binaries.sh --with kubelet,kube-controller-manager,kubectl,kube-proxy
#   scripts/k8s-binaries.sh --print-bin-dir # print the bin dir and exit
#
# Environment:
#   UNDERSTORY_CACHE     cache root (default $HOME/.cache/understory)
#   UNDERSTORY_K8S_BIN   bin dir to fill (default $UNDERSTORY_CACHE/k8s-v1.37.2/bin)
#   UNDERSTORY_K8S_EXTRA comma-separated extra binaries, same as --with
#   UNDERSTORY_NO_APT=1  do not apt-get install etcd-server (fail if etcd is missing)
#
# Concurrency: the whole build holds an flock on the cache directory, so
# parallel test binaries (or CI jobs) wait for one build instead of racing.
#
# Cost: cold, kube-apiserver dominates: ~6 min wall for apiserver+scheduler on 2
# busy cores (measured, incl. module download); extras then reuse the Go build
# cache (~1-4 min each). Warm (binaries present): < 1 s.
set -euo pipefail

K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2 # staging modules are tagged v0.<minor>.<patch>

DEFAULT_BINS=(kube-apiserver kube-scheduler)
OPTIONAL_BINS=(kubelet kube-controller-manager kubectl kube-proxy)

cache_root=${UNDERSTORY_CACHE:-$HOME/.cache/understory}
work=$cache_root/k8s-$K8S_VERSION
bin=${UNDERSTORY_K8S_BIN:-$work/bin}
extra=${UNDERSTORY_K8S_EXTRA:-}

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
	case $1 in
	--with) extra=${extra:+$extra,}$2; shift 2 ;;
	--with=*) extra=${extra:+$extra,}${1#--with=}; shift ;;
	--print-bin-dir) echo "$bin"; exit 0 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "k8s-binaries: unknown argument $1" >&2; usage >&2; exit 2 ;;
	esac
done

log() { echo "k8s-binaries: $*" >&2; }

want=("${DEFAULT_BINS[@]}")
IFS=, read -r -a extras <<<"$extra"
for b in "${extras[@]}"; do
	[ -n "$b" ] || continue
	ok=
	for o in "${OPTIONAL_BINS[@]}" "${DEFAULT_BINS[@]}"; do [ "$b" = "$o" ] && ok=1; done
	[ -n "$ok" ] || { log "unknown binary '$b' (optional: ${OPTIONAL_BINS[*]})"; exit 2; }
	case " ${want[*]} " in *" $b "*) ;; *) want+=("$b") ;; esac
done

# up_to_date BIN: the binary exists and reports the wanted version.
up_to_date() {
	local f=$bin/$1 out
	[ -x "$f" ] || return 1
	if [ "$1" = kubectl ]; then
		out=$("$f" version --client 2>/dev/null) || return 1
	else
		out=$("$f" --version 2>/dev/null) || return 1
	fi
	case $out in *"$K8S_VERSION"*) return 0 ;; esac
	return 1
}

install_etcd() {
	if command -v etcd >/dev/null 2>&1; then
		return 0
	fi
	if [ "${UNDERSTORY_NO_APT:-}" = 1 ]; then
		log "etcd not found and UNDERSTORY_NO_APT=1; install Debian's etcd-server"
		return 1
	fi
	log "installing etcd-server (Debian)"
	# Never start the packaged etcd service: the tests run their own.
	local policy=/usr/sbin/policy-rc.d created=
	if [ ! -e $policy ]; then
		printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && created=1
	fi
	local rc=0
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >/dev/null ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >/dev/null; } ||
		rc=$?
	[ -z "$created" ] || rm -f $policy
	[ $rc -eq 0 ] || { log "apt-get install etcd-server failed"; return $rc; }
	command -v etcd >/dev/null 2>&1
}

build() {
	local missing=() b
	for b in "${want[@]}"; do
		up_to_date "$b" || missing+=("$b")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		log "up to date in $bin (${want[*]})"
		return 0
	fi
	log "building ${missing[*]} $K8S_VERSION into $bin (cold: ~10 min on 2 cores)"

	local src=$work/src
	mkdir -p "$src" "$bin"
	# .ready names the commands tools.go pins: a module made for fewer commands (an older
	# version of this script) lacks go.sum entries for the new ones, so it is made again.
	local stamp="${DEFAULT_BINS[*]} ${OPTIONAL_BINS[*]}"
	if [ ! -f "$src/go.sum" ] || [ "$(cat "$src/.ready" 2>/dev/null)" != "$stamp" ]; then
		rm -f "$src/.ready"
		# The staging list comes from kubernetes' own go.mod, so it stays right
		# when K8S_VERSION moves.
		local kmod
		kmod=$(cd / && GOFLAGS=-buildvcs=false go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r .GoMod)
		{
			echo "module understory.local/k8s-binaries"
			echo
			echo "go 1.24.0"
			echo
			echo "require k8s.io/kubernetes $K8S_VERSION"
			echo
			echo "replace ("
			awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { printf "\t%s => %s '"$STAGING_VERSION"'\n", $1, $1 }' "$kmod"
			echo ")"
		} >"$src/go.mod"
		grep -q 'k8s.io/apiserver =>' "$src/go.mod" || { log "no staging replaces found in $kmod"; return 1; }
		{
			echo "//go:build tools"
			echo
			echo "// Package tools pins the Kubernetes commands this module builds."
			echo "package tools"
			echo
			echo "import ("
			for b in "${DEFAULT_BINS[@]}" "${OPTIONAL_BINS[@]}"; do
				echo "	_ \"k8s.io/kubernetes/cmd/$b\""
			done
			echo ")"
		} >"$src/tools.go"
		(cd "$src" && go mod tidy)
		echo "$stamp" >"$src/.ready"
	fi

	local ldflags="-s -w"
	ldflags+=" -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
	ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "$K8S_VERSION" | cut -d. -f1 | tr -d v)"
	ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
	ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
	ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
	local pkgs=()
	for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	# Build into a temp dir then rename, so a killed build never leaves a
	# truncated binary that looks installed.
	local tmp
	tmp=$(mktemp -d "$work/build.XXXXXX")
	local start=$SECONDS
	(cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 \
		go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") || { rm -rf "$tmp"; return 1; }
	for b in "${missing[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
	rm -rf "$tmp"
	log "built ${missing[*]} in $((SECONDS - start))s"
	for b in "${missing[@]}"; do
		up_to_date "$b" || { log "$bin/$b does not report $K8S_VERSION"; return 1; }
	done
}

mkdir -p "$work"
exec 9>"$work/.lock"
if ! flock -n 9; then
	log "waiting for another build (lock $work/.lock)"
	flock 9
fi
install_etcd
build
echo "$bin"
