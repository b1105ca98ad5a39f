# shellcheck shell=bash
# apt.sh: apt_install PKG...: install Debian packages the scripts need (retrying after an
# `apt-get update`), or fail with the caller's die when UNDERSTORY_NO_APT=1. The caller
# defines log and die. Sourced, never run.
apt_install() {
	[ "${UNDERSTORY_NO_APT:-}" != 1 ] || die "missing Debian packages $* and UNDERSTORY_NO_APT=1"
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null; }
}
