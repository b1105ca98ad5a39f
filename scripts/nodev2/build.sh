#!/usr/bin/env bash
# build.sh builds and caches the cgroup v2 + systemd node image that test/e2e/nodev2
# boots under qemu's software emulation (this machine's kernel is hybrid and its KVM runs
# only PVM guests), outside the repo in ${UNDERSTORY_CACHE:-$HOME/.cache/understory}/nodev2-<rev>:
#   rootfs.img   an 8 GiB sparse ext4 image of a Debian bookworm root made by debootstrap
#                from Debian's packages (systemd as PID 1, udev, D-Bus, the qemu guest
#                agent, iptables, Debian's CNI plugins, libseccomp, the cloud kernel);
#                the VM opens it with snapshot=on, so no run ever changes it
#   vmlinuz, initrd.img   that kernel and Debian's initramfs, from the same root
#   packages.txt          every package and version in the image (dpkg-query)
# The guest boots with systemd.unified_cgroup_hierarchy=1 (cgroup v2 only). At boot it
# mounts the run's payload disk (label us-payload, read-only) at /opt/understory and runs
# its boot.sh (understory-payload.service), and a scratch disk (label us-scratch) at
# /var/lib/understory-out.
# The image has no network configuration: a run gives it a link to this host or none.
# It installs qemu-system-x86, debootstrap and e2fsprogs with apt-get when missing.
# Cold: about a minute and a half (the download and debootstrap); warm: instant.
#
#   scripts/nodev2/build.sh                  # build what is missing, print the cache dir
#   UNDERSTORY_NO_APT=1 scripts/nodev2/build.sh   # never apt-get install on this host
set -euo pipefail

# REV names the image's contents: change it with the package list or the baked config.
REV=bookworm-r2
SUITE=bookworm
MIRROR=${UNDERSTORY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,udev,dbus,qemu-guest-agent,iproute2,iptables,conntrack,kmod,procps,libseccomp2,containernetworking-plugins,linux-image-cloud-amd64
CACHE_ROOT=${UNDERSTORY_CACHE:-$HOME/.cache/understory}
OUT=$CACHE_ROOT/nodev2-$REV

log() { echo "nodev2: $*" >&2; }
die() { log "$*"; exit 1; }

case ${1:-} in
--print-dir) echo "$OUT"; exit 0 ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
'') ;;
*) die "unknown argument $1" ;;
esac

complete() { [ -s "$OUT/rootfs.img" ] && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ] && [ -s "$OUT/packages.txt" ]; }

# shellcheck source=../lib/apt.sh
. "$(dirname "$0")/../lib/apt.sh"

host_deps() {
	local need=()
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
	command -v debootstrap >/dev/null || need+=(debootstrap)
	command -v mkfs.ext4 >/dev/null && command -v debugfs >/dev/null || need+=(e2fsprogs)
	[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
}

host_deps
if complete; then
	echo "$OUT"
	exit 0
fi
[ "$(id -u)" = 0 ] || die "building the node image needs root (debootstrap chroots)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.nodev2-build.lock"
flock 9
if complete; then
	echo "$OUT"
	exit 0
fi

T0=$SECONDS
work=$(mktemp -d "$CACHE_ROOT/.nodev2-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
log "debootstrap $SUITE ($PACKAGES) into $root"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
	{ tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }

# The baked configuration: what every run has, whatever its payload.
cat >"$root/etc/fstab" <<'EOF'
/dev/vda / ext4 rw,noatime 0 1
LABEL=us-payload /opt/understory ext4 ro,nofail,x-systemd.device-timeout=180s 0 0
LABEL=us-scratch /var/lib/understory-out ext4 rw,nofail,x-systemd.device-timeout=180s 0 0
EOF
mkdir -p "$root/opt/understory" "$root/var/lib/understory-out"
echo understory-v2 >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 understory-v2\n' >"$root/etc/hosts"
: >"$root/etc/resolv.conf"
# The payload's boot.sh: whatever the run wants done at boot (run test binaries, start a node).
cat >"$root/etc/systemd/system/understory-payload.service" <<'EOF'
[Unit]
Description=Run the payload's boot.sh
After=local-fs.target dbus.service systemd-modules-load.service
ConditionPathExists=/opt/understory/boot.sh

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/understory/boot.sh
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/understory-payload.service "$root/etc/systemd/system/multi-user.target.wants/understory-payload.service"
# Under emulation every CPU second counts: no timers, no getty on the serial line (the
# console is read by the test), journald kept in memory.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer dpkg-db-backup.timer \
	systemd-tmpfiles-clean.timer serial-getty@ttyS0.service getty@tty1.service; do
	ln -sf /dev/null "$root/etc/systemd/system/$u"
done
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' >"$root/etc/systemd/journald.conf.d/understory.conf"
# Modules a node needs (containerd's overlayfs snapshotter, the pod bridge, kube-proxy).
printf '%s\n' overlay br_netfilter bridge veth >"$root/etc/modules-load.d/understory.conf"
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$work/packages.txt"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
	"$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
mkfs.ext4 -q -F -L understory-v2 -d "$root" "$work/rootfs.img" 8G >&2
rm -rf "$root"
mkdir -p "$OUT"
for f in vmlinuz initrd.img packages.txt rootfs.img; do
	mv "$work/$f" "$OUT/$f"
done
log "built $OUT in $((SECONDS - T0)) s"
echo "$OUT"
