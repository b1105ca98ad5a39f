#!/usr/bin/env bash
# prometheus.sh prints the path of a Prometheus server binary, installing Debian's
# `prometheus` package first when none is found. The dashboard test
# (test/e2e/dashboards) and `make dashboards` run it; it is idempotent and fast
# once Prometheus is there.
#
#   scripts/prometheus.sh        # prints e.g. /usr/bin/prometheus on stdout
#
# Environment:
#   UNDERSTORY_PROMETHEUS  use this binary (it must be executable); no install
#   UNDERSTORY_NO_APT=1    never apt-get install (fail if Prometheus is missing)
#
# Only the package is installed (--no-install-recommends: no node exporter). Its
# service is never started or touched: the tests run their own server on free
# ports in a temp dir. Installing needs root and apt-get; without them the script
# fails with a message naming the missing dependency (exit 1), never silently.
set -euo pipefail

log() { echo "prometheus.sh: $*" >&2; }

if [ -n "${UNDERSTORY_PROMETHEUS:-}" ]; then
	if [ -x "$UNDERSTORY_PROMETHEUS" ]; then
		echo "$UNDERSTORY_PROMETHEUS"
		exit 0
	fi
	log "UNDERSTORY_PROMETHEUS=$UNDERSTORY_PROMETHEUS is not an executable file"
	exit 1
fi

found() {
	local p
	p=$(command -v prometheus 2>/dev/null) || return 1
	# Debian's /usr/bin/prometheus; a directory or a script named so would not do.
	"$p" --version >/dev/null 2>&1 || return 1
	echo "$p"
}

if found; then
	exit 0
fi

if [ "${UNDERSTORY_NO_APT:-}" = 1 ]; then
	log "prometheus not found in PATH and UNDERSTORY_NO_APT=1: install Debian's prometheus package"
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	log "prometheus not found in PATH; installing Debian's prometheus package needs root (apt-get install prometheus)"
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "prometheus not found in PATH and there is no apt-get: install a Prometheus 2.x server and set UNDERSTORY_PROMETHEUS"
	exit 1
fi

# One installer at a time (parallel test binaries); apt-get takes its own lock too,
# but fails rather than waits when it is held.
lock=${TMPDIR:-/tmp}/understory-prometheus-install.lock
exec 9>"$lock"
flock 9
if found; then # installed while we waited
	exit 0
fi
log "installing Debian's prometheus package (apt-get, once)"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends prometheus >&2; then
	log "apt-get install failed; refreshing the package lists and trying again"
	apt-get update >&2
	apt-get install -y --no-install-recommends prometheus >&2
fi
if ! found; then
	log "the prometheus package was installed but no working prometheus binary is in PATH"
	exit 1
fi
