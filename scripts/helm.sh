#!/usr/bin/env bash
# helm.sh builds the Helm client (helm.sh/helm/v3's cmd/helm) that the chart test
# (test/helmchart) runs, and prints the directory it is in.
#
# Helm is built from the Go module proxy (no git clone, no release download) with
# `go install helm.sh/helm/v3/cmd/helm@VERSION` into a cache directory OUTSIDE the
# repo, and reused on the next run when `helm version` reports the wanted version.
#
#   scripts/helm.sh                 # build when missing, print the bin dir
#   scripts/helm.sh --print-bin-dir # print the bin dir and exit (builds nothing)
#
# Environment:
#   UNDERSTORY_CACHE     cache root (default $HOME/.cache/understory)
#   UNDERSTORY_HELM_BIN  bin dir to fill (default $UNDERSTORY_CACHE/helm-v3.22.0/bin)
#
# Needs go and jq. Concurrency: the build holds an flock on the cache directory, so parallel test
# binaries (or CI jobs) wait for one build instead of racing.
#
# Cost: cold, 17 min wall measured on 2 busy cores (incl. module download); a
# rebuild with Go's build cache warm, ~2 min; warm
# (binary present): < 1 s.
set -euo pipefail

HELM_VERSION=v3.22.0

# shellcheck source=lib/gotool.sh
. "$(dirname "$0")/lib/gotool.sh"
gotool_init helm "$HELM_VERSION" "${UNDERSTORY_HELM_BIN:-}"
gotool_args "$@"

# ldflags: helm's own release flags. Besides its version, the Kubernetes version
# `helm template` and `helm lint` assume (Capabilities.KubeVersion; without it v1.20,
# and charts with a kubeVersion constraint refuse to render), from the client-go
# helm is built with, as helm's Makefile does.
ldflags() {
	local gomod kv
	gomod=$(cd / && GOFLAGS=-buildvcs=false go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | jq -r .GoMod)
	kv=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$gomod")
	[ -n "$kv" ] || { gotool_log "no k8s.io/client-go in $gomod"; return 1; }
	kv=${kv#v}
	local major=$((${kv%%.*} + 1)) minor
	minor=$(echo "$kv" | cut -d. -f2)
	local f="-s -w"
	f+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	f+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	f+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major"
	f+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
	f+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major"
	f+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
	echo "$f"
}

# up_to_date: the binary exists, reports the wanted version and was built with
# these flags (stamp .ldflags).
up_to_date() {
	local out
	[ -x "$bin/helm" ] || return 1
	[ "$(cat "$bin/.ldflags" 2>/dev/null)" = "$1" ] || return 1
	out=$("$bin/helm" version --short 2>/dev/null) || return 1
	case $out in "$HELM_VERSION"*) return 0 ;; esac
	return 1
}

build() {
	local flags
	flags=$(ldflags) || return 1
	if up_to_date "$flags"; then
		gotool_log "up to date in $bin (helm $HELM_VERSION)"
		return 0
	fi
	gotool_log "building helm $HELM_VERSION into $bin (cold: ~15 min on 2 busy cores)"
	mkdir -p "$bin"
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$work/build.XXXXXX")
	gotool_install "$tmp" "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || { rm -rf "$tmp"; return 1; }
	mv -f "$tmp/helm" "$bin/helm"
	echo "$flags" >"$bin/.ldflags"
	rm -rf "$tmp"
	gotool_log "built helm in $((SECONDS - start))s"
	up_to_date "$flags" || { gotool_log "$bin/helm does not report $HELM_VERSION"; return 1; }
}

gotool_locked build
