#!/usr/bin/env bash
# cross.sh installs Debian's arm64 cross compiler and sysroot when missing: the
# release's GPU agent for arm64 is built with them (scripts/release.sh). Root; apt.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "cross.sh: $*" >&2; }
die() { echo "cross.sh: $*" >&2; exit 1; }
# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh
command -v aarch64-linux-gnu-gcc >/dev/null && [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] && exit 0
[ "$(id -u)" = 0 ] || die "the arm64 cross compiler is missing: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross (as root)"
apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
