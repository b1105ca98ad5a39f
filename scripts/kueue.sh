#!/usr/bin/env bash
# kueue.sh builds Kueue's manager (sigs.k8s.io/kueue's cmd/kueue) for the tests that
# run Kueue in front of the scheduler extender (test/e2e/kueue_test.go), puts Kueue's
# CRDs next to it, and prints the directory it is in.
#
# Kueue is built from the Go module proxy (no git clone, no release download) with
# `go install sigs.k8s.io/kueue/cmd/kueue@VERSION` into a cache directory OUTSIDE the
# repo. The CRDs are copied from the same module zip (config/components/crd/bases,
# found with `go mod download -json`) into one file, crds.yaml, next to the binary.
# Both are reused on the next run when the stamp (.stamp: version and module sum)
# matches: the manager has no --version flag to ask.
#
#   scripts/kueue.sh                 # build when missing, print the bin dir
#   scripts/kueue.sh --print-bin-dir # print the bin dir and exit (builds nothing)
#
# The bin dir then holds:
#   kueue       the manager (run it with --config FILE; see docs/kueue.md)
#   crds.yaml   every CustomResourceDefinition of Kueue VERSION, as one YAML stream
#
# Environment:
#   UNDERSTORY_CACHE      cache root (default $HOME/.cache/understory)
#   UNDERSTORY_KUEUE_BIN  bin dir to fill (default $UNDERSTORY_CACHE/kueue-v0.17.0/bin)
#
# Needs go and jq. Kueue v0.17.0's go.mod asks for go 1.25 and k8s.io/* v0.35 (the
# client side only: it runs against the v1.37.2 API server of the tests). Concurrency:
# the build holds an flock on the cache directory, so parallel test binaries (or CI
# jobs) wait for one build instead of racing.
#
# Cost: cold, 21 min wall (11 min CPU) measured on 2 cores shared with other builds
# and tests (load average ~10), module download included; on 2 idle cores expect about
# half the wall time. Warm (binary, CRDs and stamp present): < 1 s.
set -euo pipefail

KUEUE_VERSION=v0.17.0
KUEUE_MODULE=sigs.k8s.io/kueue

# shellcheck source=lib/gotool.sh
. "$(dirname "$0")/lib/gotool.sh"
gotool_init kueue "$KUEUE_VERSION" "${UNDERSTORY_KUEUE_BIN:-}"
gotool_args "$@"

# module_json: `go mod download -json` of the module, run outside any module
# (the repo's go.mod must not take part).
module_json() {
	(cd / && GOFLAGS=-buildvcs=false go mod download -json "$KUEUE_MODULE@$KUEUE_VERSION")
}

# up_to_date: binary and CRDs exist and the stamp names this version and sum.
up_to_date() {
	[ -x "$bin/kueue" ] || return 1
	[ -s "$bin/crds.yaml" ] || return 1
	[ "$(cat "$bin/.stamp" 2>/dev/null)" = "$1" ] || return 1
}

# concat_crds DIR OUT: every *.yaml of DIR, sorted, as one stream with "---"
# separators, into OUT.
concat_crds() {
	local dir=$1 out=$2 f n=0
	: >"$out"
	for f in "$dir"/*.yaml; do
		[ -e "$f" ] || continue
		[ "$(basename "$f")" = kustomization.yaml ] && continue
		printf -- '---\n' >>"$out"
		cat "$f" >>"$out"
		n=$((n + 1))
	done
	[ "$n" -gt 0 ] || { gotool_log "no CRDs in $dir"; return 1; }
	gotool_log "$n CRDs from $dir"
}

build() {
	local js dir sum stamp
	js=$(module_json) || { gotool_log "go mod download $KUEUE_MODULE@$KUEUE_VERSION failed"; return 1; }
	dir=$(jq -r .Dir <<<"$js")
	sum=$(jq -r .Sum <<<"$js")
	[ -d "$dir" ] || { gotool_log "module dir $dir missing"; return 1; }
	stamp="$KUEUE_VERSION $sum"
	if up_to_date "$stamp"; then
		gotool_log "up to date in $bin (kueue $KUEUE_VERSION)"
		return 0
	fi
	gotool_log "building kueue $KUEUE_VERSION into $bin (cold: ~11 min of CPU, up to ~20 min on 2 busy cores)"
	mkdir -p "$bin"
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$work/build.XXXXXX")
	gotool_install "$tmp" "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
		"$KUEUE_MODULE/cmd/kueue@$KUEUE_VERSION" || { rm -rf "$tmp"; return 1; }
	concat_crds "$dir/config/components/crd/bases" "$tmp/crds.yaml" || { rm -rf "$tmp"; return 1; }
	mv -f "$tmp/kueue" "$bin/kueue"
	mv -f "$tmp/crds.yaml" "$bin/crds.yaml"
	echo "$stamp" >"$bin/.stamp"
	rm -rf "$tmp"
	gotool_log "built kueue in $((SECONDS - start))s"
	up_to_date "$stamp" || { gotool_log "$bin is incomplete after the build"; return 1; }
}

gotool_locked build
