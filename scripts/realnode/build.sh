#!/usr/bin/env bash
# build.sh builds and caches everything a real single-node Kubernetes needs here,
# outside the repo (${UNDERSTORY_CACHE:-$HOME/.cache/understory}):
#   - containerd, containerd-shim-runc-v2, ctr  (containerd v2.1.4, Go module proxy)
#   - runc v1.3.0 with seccomp (cgo; apt-get installs libseccomp-dev)
#   - kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kube-proxy,
#     kubectl v1.37.2 (scripts/k8s-binaries.sh) and Debian's etcd
#   - Debian's CNI plugins (loopback, bridge, host-local), iptables and busybox-static
#   - two image tarballs, made by the repo's cmd/mkimage (go-containerregistry, the
#     same build as `make images`): a pause image (a static Go program that waits for
#     SIGTERM and reaps children) and a busybox-static image
# Every Go build runs in a throwaway module in the cache dir, under `nice`.
# Warm (everything present at the right version): about a second.
#
#   scripts/realnode/build.sh            # build what is missing, print the cache dir
#   UNDERSTORY_NO_APT=1 scripts/realnode/build.sh   # never apt-get install
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

export GOFLAGS=-buildvcs=false

# shellcheck source=../lib/apt.sh
. "$(dirname "$0")/../lib/apt.sh"

debian_deps() {
	local need=()
	[ -x $CNI_BIN_DIR/loopback ] && [ -x $CNI_BIN_DIR/bridge ] && [ -x $CNI_BIN_DIR/host-local ] ||
		need+=(containernetworking-plugins)
	# kube-proxy (iptables mode) and kubelet run iptables/ip6tables; the bridge needs ip.
	command -v iptables >/dev/null && command -v ip6tables >/dev/null || need+=(iptables)
	command -v ip >/dev/null || need+=(iproute2)
	[ -x /bin/busybox ] && file_static /bin/busybox || need+=(busybox-static)
	pkg-config --exists libseccomp 2>/dev/null || need+=(libseccomp-dev pkg-config)
	# scripts/k8s-binaries.sh reads `go mod download -json` with jq (the images do not).
	command -v jq >/dev/null || need+=(jq)
	[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
}

# file_static F: F is a statically linked ELF (no program interpreter).
file_static() { ! LC_ALL=C readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; }

# reports VERSION CMD...: CMD's output mentions VERSION.
reports() {
	local v=$1 out
	shift
	out=$("$@" 2>/dev/null) || return 1
	case $out in *"$v"*) return 0 ;; esac
	return 1
}

build_containerd() {
	if reports "${CONTAINERD_VERSION#v}" "$RT_BIN/containerd" --version && [ -x "$RT_BIN/containerd-shim-runc-v2" ] && [ -x "$RT_BIN/ctr" ]; then
		return 0
	fi
	log "building containerd $CONTAINERD_VERSION (+ shim, ctr) into $RT_BIN"
	local src=$RT_WORK/src
	mkdir -p "$src" "$RT_BIN"
	if [ ! -f "$src/.ready" ]; then
		cat >"$src/go.mod" <<EOF
module understory.local/containerd-build

go 1.24.0

require github.com/containerd/containerd/v2 $CONTAINERD_VERSION
EOF
		cat >"$src/tools.go" <<'EOF'
//go:build tools

// Package tools pins the containerd commands this module builds.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
EOF
		(cd "$src" && nice -n 10 go mod tidy)
		touch "$src/.ready"
	fi
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$RT_WORK/build.XXXXXX")
	local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	# no_btrfs/no_devmapper: those snapshotters need cgo headers we do not use (overlayfs).
	(cd "$src" && CGO_ENABLED=0 nice -n 10 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" -o "$tmp/" \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr) || { rm -rf "$tmp"; return 1; }
	mv -f "$tmp"/* "$RT_BIN/"
	rm -rf "$tmp"
	log "built containerd in $((SECONDS - start))s"
	reports "${CONTAINERD_VERSION#v}" "$RT_BIN/containerd" --version || die "$RT_BIN/containerd does not report $CONTAINERD_VERSION"
}

build_runc() {
	if reports "${RUNC_VERSION#v}" "$RUNC_BIN/runc" --version && reports seccomp "$RUNC_BIN/runc" --version; then
		return 0
	fi
	log "building runc $RUNC_VERSION (seccomp) into $RUNC_BIN"
	local src=$RUNC_WORK/src
	mkdir -p "$src" "$RUNC_BIN"
	if [ ! -f "$src/.ready" ]; then
		cat >"$src/go.mod" <<EOF
module understory.local/runc-build

go 1.24.0

require github.com/opencontainers/runc $RUNC_VERSION
EOF
		cat >"$src/tools.go" <<'EOF'
//go:build tools

// Package tools pins runc.
package tools

import _ "github.com/opencontainers/runc"
EOF
		(cd "$src" && nice -n 10 go mod tidy)
		touch "$src/.ready"
	fi
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$RUNC_WORK/build.XXXXXX")
	(cd "$src" && CGO_ENABLED=1 nice -n 10 go build -trimpath -tags seccomp \
		-ldflags "-X main.version=${RUNC_VERSION#v}" -o "$tmp/runc" github.com/opencontainers/runc) || { rm -rf "$tmp"; return 1; }
	mv -f "$tmp/runc" "$RUNC_BIN/runc"
	rm -rf "$tmp"
	log "built runc in $((SECONDS - start))s"
	reports seccomp "$RUNC_BIN/runc" --version || die "$RUNC_BIN/runc has no seccomp support"
}

build_k8s() {
	"$REPO_ROOT/scripts/k8s-binaries.sh" --with kubelet,kube-controller-manager,kubectl,kube-proxy >/dev/null
}

# The pause program: PID 1 of every pod sandbox. It reaps children and exits on
# SIGTERM/SIGINT.
build_pause() {
	local src=$IMG_DIR/pause-src
	[ -x "$IMG_DIR/pause" ] && [ -f "$src/.ready" ] && return 0
	mkdir -p "$src"
	cat >"$src/go.mod" <<'EOF'
module understory.local/pause

go 1.22
EOF
	cat >"$src/main.go" <<'EOF'
// Command pause is the sandbox process of the real-node test pods: it waits for
// SIGTERM or SIGINT and reaps every child it inherits meanwhile.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
	(cd "$src" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$IMG_DIR/pause.tmp" .)
	mv -f "$IMG_DIR/pause.tmp" "$IMG_DIR/pause"
	touch "$src/.ready"
}

# mkimage: the repo's image builder (cmd/mkimage, package images), rebuilt every run
# (the Go build cache makes that quick) so the images always come from the current code.
build_mkimage() {
	(cd "$REPO_ROOT" && CGO_ENABLED=0 nice -n 10 go build -trimpath -o "$IMG_DIR/mkimage.tmp" ./cmd/mkimage)
	mv -f "$IMG_DIR/mkimage.tmp" "$IMG_DIR/mkimage"
}

# The pause and busybox images, as `docker save`-style tarballs that up.sh imports
# with `ctr images import`. mkimage's output is reproducible (fixed mtimes, numeric
# owners), so writing them again on every run changes nothing but costs ~0.5 s.
build_images() {
	mkdir -p "$IMG_DIR"
	build_pause
	build_mkimage
	local r
	r=$(mktemp -d "$IMG_DIR/rootfs.XXXXXX")
	cp "$IMG_DIR/pause" "$r/pause"
	"$IMG_DIR/mkimage" dir -ref "$PAUSE_IMAGE" -rootfs "$r" -out "$IMG_DIR/pause.tar" \
		-entrypoint /pause -user 0 >/dev/null || { rm -rf "$r"; return 1; }
	rm -rf "$r"

	r=$(mktemp -d "$IMG_DIR/rootfs.XXXXXX")
	mkdir -p "$r/bin" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/etc"
	chmod 1777 "$r/tmp"
	cp /bin/busybox "$r/bin/busybox"
	local app
	for app in $(/bin/busybox --list); do
		[ "$app" = busybox ] || ln -sf busybox "$r/bin/$app"
	done
	echo 'root:x:0:0:root:/:/bin/sh' >"$r/etc/passwd"
	echo 'root:x:0:' >"$r/etc/group"
	"$IMG_DIR/mkimage" dir -ref "$BUSYBOX_IMAGE" -rootfs "$r" -out "$IMG_DIR/busybox.tar" \
		-cmd sh -env PATH=/bin -user 0 >/dev/null || { rm -rf "$r"; return 1; }
	rm -rf "$r"
	rm -f "$IMG_DIR/.images" # the stamp of the hand-made images, before mkimage
}

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.realnode-build.lock"
flock 9
debian_deps
build_k8s
build_containerd
build_runc
build_images
echo "$CACHE_ROOT"
