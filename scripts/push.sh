#!/usr/bin/env bash
# push.sh sends a release ($DIST, made by scripts/release.sh for the same REGISTRY) to
# REGISTRY: every image as REGISTRY/<name>:<tag> (its multi-platform index), and the
# chart as oci://REGISTRY/charts/understory:<tag>. Credentials are docker's and
# helm's own (~/.docker/config.json, `helm registry login`).
#
#   make push REGISTRY=registry.example/understory [INSECURE=1]   # INSECURE: plain HTTP
set -euo pipefail
cd "$(dirname "$0")/.."

DIST=${DIST:-dist}
BIN=${BIN:-bin}
GO=${GO:-go}
HELM=${HELM:-$(scripts/helm.sh --print-bin-dir)/helm}
die() { echo "push.sh: $*" >&2; exit 1; }
[ -n "${REGISTRY:-}" ] || die "REGISTRY is required (the one the release was made for)"
[ -f "$DIST/images/images.json" ] || die "no release in $DIST: run make release REGISTRY=$REGISTRY first"
grep -q "image: $REGISTRY/" "$DIST/install.yaml" ||
	die "$DIST was released for another registry (its install.yaml names none under $REGISTRY/): run make release REGISTRY=$REGISTRY"

insecure=() plain=()
if [ -n "${INSECURE:-}" ]; then insecure=(-insecure); plain=(--plain-http); fi
$GO build -o "$BIN/mkimage" ./cmd/mkimage
"$BIN/mkimage" push -registry "$REGISTRY" -images "$DIST/images" "${insecure[@]}"
for chart in "$DIST"/understory-*.tgz; do
	"$HELM" push "$chart" "oci://$REGISTRY/charts" "${plain[@]}"
done
