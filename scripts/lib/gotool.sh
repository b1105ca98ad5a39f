# shellcheck shell=bash
# gotool.sh: what scripts/helm.sh, scripts/kwok.sh and scripts/kueue.sh share: a Go
# tool built from the module proxy into a cache directory OUTSIDE the repo, reused
# when present, the build under an flock. Sourced, never run.
#
#   gotool_init NAME VERSION BIN_OVERRIDE   sets work ($UNDERSTORY_CACHE/NAME-VERSION)
#                                           and bin (BIN_OVERRIDE, else $work/bin)
#   gotool_args "$@"                        --print-bin-dir, -h/--help (the caller's
#                                           header comment), else exit 2
#   gotool_log MSG...                       to stderr, prefixed with the script's name
#   gotool_install TMP FLAGS PKG@VERSION    go install into TMP, outside any module
#   gotool_locked FUNC                      runs FUNC under $work/.lock, prints $bin

gotool_init() {
	local cache_root=${UNDERSTORY_CACHE:-$HOME/.cache/understory}
	work=$cache_root/$1-$2
	bin=${3:-$work/bin}
}

gotool_usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

gotool_args() {
	while [ $# -gt 0 ]; do
		case $1 in
		--print-bin-dir) echo "$bin"; exit 0 ;;
		-h | --help) gotool_usage; exit 0 ;;
		*) echo "$(basename "$0"): unknown argument $1" >&2; gotool_usage >&2; exit 2 ;;
		esac
	done
}

gotool_log() { echo "$(basename "$0"): $*" >&2; }

# gotool_install TMP FLAGS PKG@VERSION: static, trimmed, niced; run from / so that
# the repo's go.mod takes no part. Build into a temp dir and rename after, so that a
# killed build never leaves a truncated binary that looks installed.
gotool_install() {
	(cd / && CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$1" nice -n 10 \
		go install -trimpath -ldflags "$2" "$3")
}

# gotool_locked FUNC: one build at a time per tool and version (parallel test binaries
# or CI jobs wait for it instead of racing), then the bin dir on stdout.
gotool_locked() {
	mkdir -p "$work"
	exec 9>"$work/.lock"
	if ! flock -n 9; then
		gotool_log "waiting for another build (lock $work/.lock)"
		flock 9
	fi
	"$1"
	echo "$bin"
}
