#!/usr/bin/env bash
# kwok.sh builds kwok's controller (sigs.k8s.io/kwok's cmd/kwok), which plays the
# kubelet of thousands of fake nodes for the cluster benchmark (bench/clusterbench,
# `make bench-cluster`), and prints the directory it is in.
#
# kwok is built from the Go module proxy (no git clone, no release download) with
# `go install sigs.k8s.io/kwok/cmd/kwok@VERSION` into a cache directory OUTSIDE the
# repo, and reused on the next run when `kwok --version` reports the wanted version.
#
#   scripts/kwok.sh                 # build when missing, print the bin dir
#   scripts/kwok.sh --print-bin-dir # print the bin dir and exit (builds nothing)
#
# Environment:
#   UNDERSTORY_CACHE     cache root (default $HOME/.cache/understory)
#   UNDERSTORY_KWOK_BIN  bin dir to fill (default $UNDERSTORY_CACHE/kwok-v0.7.0/bin)
#
# Needs go. Concurrency: the build holds an flock on the cache directory, so parallel
# runs wait for one build instead of racing.
#
# Cost: cold, 12 min wall (705 s) measured on 2 cores busy with other builds (load
# average ~10), module download included;
# warm (binary present): < 1 s.
set -euo pipefail

KWOK_VERSION=v0.7.0

# shellcheck source=lib/gotool.sh
. "$(dirname "$0")/lib/gotool.sh"
gotool_init kwok "$KWOK_VERSION" "${UNDERSTORY_KWOK_BIN:-}"
gotool_args "$@"

# The version kwok reports (its release flags; without them it says "unknown").
flags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"

# up_to_date: the binary exists, was built with these flags (stamp .ldflags) and
# reports the wanted version.
up_to_date() {
	local out
	[ -x "$bin/kwok" ] || return 1
	[ "$(cat "$bin/.ldflags" 2>/dev/null)" = "$flags" ] || return 1
	out=$("$bin/kwok" --version 2>/dev/null) || return 1
	case $out in *"$KWOK_VERSION"*) return 0 ;; esac
	return 1
}

build() {
	if up_to_date; then
		gotool_log "up to date in $bin (kwok $KWOK_VERSION)"
		return 0
	fi
	gotool_log "building kwok $KWOK_VERSION into $bin (cold: ~12 min on 2 busy cores)"
	mkdir -p "$bin"
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$work/build.XXXXXX")
	gotool_install "$tmp" "$flags" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" || { rm -rf "$tmp"; return 1; }
	mv -f "$tmp/kwok" "$bin/kwok"
	echo "$flags" >"$bin/.ldflags"
	rm -rf "$tmp"
	gotool_log "built kwok in $((SECONDS - start))s"
	up_to_date || { gotool_log "$bin/kwok does not report $KWOK_VERSION"; return 1; }
}

gotool_locked build
