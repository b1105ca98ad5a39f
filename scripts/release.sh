#!/usr/bin/env bash
# release.sh writes a release into $DIST (default dist/): everything a user installs
# Understory from, built here, checksummed.
#
#   install.yaml                      the manifests (base + cert-manager certificates),
#                                     one file: kubectl apply --server-side -f
#   understory-<tag>.tgz, index.yaml  the Helm chart, defaulting to the release's
#                                     images, and its repository index
#   images/<name>.oci.tar             each image as a multi-platform OCI archive
#                                     (linux/amd64 and linux/arm64; the cgo GPU agent's
#                                     arm64 build by Debian's cross compiler, installed
#                                     when missing), images/images.json,
#                                     images/sbom/<name>_linux_<arch>.spdx.json
#   kubectl-understory_linux_<arch>.tar.gz and krew/understory.yaml
#                                     the kubectl plugin and its krew manifest
#   SHA256SUMS                        of every file above
#
# The tag is VERSION when HEAD is tagged v<VERSION> and the tree is clean, else
# VERSION-g<commit>[-dirty]: a development build never reuses a tag a node may
# have cached. Images are named $REGISTRY/<name>:<tag> in install.yaml and the
# chart (REGISTRY default ghcr.io/understory); `make push` (not yet) or
# `crane push images/<name>.oci.tar $REGISTRY/<name>:<tag>` puts them there.
#
# Environment: DIST, BIN (default bin), REGISTRY, RELEASE_URL (where the plugin's
# archives and the chart are downloaded from, for krew and index.yaml), HELM and
# KUBECTL (default: the cached builds of scripts/helm.sh and scripts/k8s-binaries.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

DIST=${DIST:-dist}
BIN=${BIN:-bin}
REGISTRY=${REGISTRY:-ghcr.io/understory}
VERSION=$(cat VERSION)
GO=${GO:-go}
HELM=${HELM:-$(scripts/helm.sh --print-bin-dir)/helm}
KUBECTL=${KUBECTL:-$(scripts/k8s-binaries.sh --print-bin-dir)/kubectl}

die() { echo "release.sh: $*" >&2; exit 1; }
[ -x "$HELM" ] || die "no helm at $HELM (make helm-bin)"
[ -x "$KUBECTL" ] || die "no kubectl at $KUBECTL (make k8s-bins)"
[ -f "$BIN/libunderstory-tsg.so" ] || die "no $BIN/libunderstory-tsg.so (make tsg-shim)"

commit=$(git rev-parse --short=12 HEAD)
if [ "$(git describe --exact-match --tags HEAD 2>/dev/null || true)" = "v$VERSION" ] && git diff --quiet HEAD; then
	TAG=$VERSION
else
	TAG=$VERSION-g$commit
	git diff --quiet HEAD || TAG=$TAG-dirty
fi
RELEASE_URL=${RELEASE_URL:-https://github.com/understory/understory/releases/download/v$TAG}
echo "release $TAG into $DIST (images $REGISTRY/<name>:$TAG)"

rm -rf "$DIST"
mkdir -p "$DIST/images" "$DIST/krew"
rel=$BIN/release
rm -rf "$rel"
export CGO_ENABLED=0 GOOS=linux
for arch in amd64 arm64; do
	mkdir -p "$rel/$arch"
	GOARCH=$arch $GO build -trimpath -o "$rel/$arch/" ./cmd/scheduler-extender ./cmd/admission ./cmd/kueue-quota \
		./cmd/kubectl-understory
	GOARCH=$arch $GO build -trimpath -o "$rel/$arch/koordlet-nogpu" ./cmd/koordlet
done
# The GPU agent links NVML through cgo, and so does its time-slice shim: for arm64
# (Grace Hopper nodes) with Debian's cross compiler, its image's loader and glibc
# copied from the cross sysroot.
CGO_ENABLED=1 GOARCH=amd64 $GO build -trimpath -o "$rel/amd64/koordlet" ./cmd/koordlet
cp "$BIN/libunderstory-tsg.so" "$rel/amd64/"
scripts/cross.sh
CC=aarch64-linux-gnu-gcc CGO_ENABLED=1 GOARCH=arm64 $GO build -trimpath -o "$rel/arm64/koordlet" ./cmd/koordlet 2>/dev/null ||
	CC=aarch64-linux-gnu-gcc CGO_ENABLED=1 GOARCH=arm64 $GO build -trimpath -o "$rel/arm64/koordlet" ./cmd/koordlet
aarch64-linux-gnu-gcc -shared -fPIC -O2 -Wall -Wextra -o "$rel/arm64/libunderstory-tsg.so" \
	koordlet/gpu/timeslice/shim/understory_tsg.c -Wl,--no-as-needed -l:libdl.so.2
unset GOOS
$GO build -o "$BIN/mkimage" ./cmd/mkimage
"$BIN/mkimage" release -version "$TAG" -bin "amd64=$rel/amd64" -bin "arm64=$rel/arm64" \
	-lib-root arm64=/usr/aarch64-linux-gnu -out "$DIST/images"

# install.yaml: the base with cert-manager's certificates (a release file carries no
# private key), every image at $REGISTRY/<name>:$TAG.
# The overlay lives outside the tree (tests copy manifests/ while this runs); kustomize
# takes its resources by a relative path.
overlay=$(mktemp -d "${TMPDIR:-/tmp}/understory-release.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
m=$(realpath --relative-to="$overlay" manifests)
{
	echo "apiVersion: kustomize.config.k8s.io/v1beta1"
	echo "kind: Kustomization"
	echo "resources: [$m/base]"
	echo "components: [$m/components/cert-manager]"
	echo "images:"
	for name in koordlet koordlet-nogpu scheduler-extender admission kueue-quota; do
		echo "  - {name: understory/$name, newName: $REGISTRY/$name, newTag: \"$TAG\"}"
	done
} >"$overlay/kustomization.yaml"
"$KUBECTL" kustomize "$overlay" >"$DIST/install.yaml"

# The chart, its images defaulting to the release's.
chart=$(mktemp -d "$DIST/.chart.XXXXXX")
cp -r charts/understory "$chart/"
sed -i -e "s|^  repository: understory$|  repository: $REGISTRY|" -e "s|^  tag: \"$VERSION\"$|  tag: \"$TAG\"|" \
	"$chart/understory/values.yaml"
grep -q "^  tag: \"$TAG\"$" "$chart/understory/values.yaml" || die "the chart's image.tag is not \"$VERSION\" in values.yaml"
"$HELM" package "$chart/understory" --version "$TAG" --app-version "$TAG" -d "$DIST" >/dev/null
rm -rf "$chart"
"$HELM" repo index "$DIST" --url "$RELEASE_URL"

# The kubectl plugin and its krew manifest.
krew="$DIST/krew/understory.yaml"
cat >"$krew" <<KREW
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: understory
spec:
  version: v$TAG
  homepage: https://github.com/understory/understory
  shortDescription: Why a batch or GPU pod waits, and what a node's agent gives batch
  description: |
    kubectl understory node NAME shows the Understory node agent's batch budget, term
    by term, and each batch pod's state; kubectl understory why POD says why a batch
    or GPU pod is Pending or slowed.
  platforms:
KREW
for arch in amd64 arm64; do
	archive=kubectl-understory_linux_$arch.tar.gz
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rel/$arch" -cf - kubectl-understory |
		gzip -n >"$DIST/$archive"
	sum=$(sha256sum "$DIST/$archive" | cut -d' ' -f1)
	cat >>"$krew" <<KREW
    - selector:
        matchLabels: {os: linux, arch: $arch}
      uri: $RELEASE_URL/$archive
      sha256: $sum
      bin: kubectl-understory
KREW
done

(cd "$DIST" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release $TAG: $(wc -l <"$DIST/SHA256SUMS") files in $DIST"
