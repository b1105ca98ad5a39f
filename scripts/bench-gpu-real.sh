#!/usr/bin/env bash
# The real-GPU benchmark (make bench-gpu-real; docs/benchmarks.md, "Real GPU").
#
#   scripts/bench-gpu-real.sh build     build bin/koordlet (cgo, stripped), bin/gpureal-bench
#                                       and bin/gpureal-bundle.tar.gz (both, to carry to a
#                                       machine without Go)
#   scripts/bench-gpu-real.sh [FLAGS]   run it: stops at once without an NVIDIA GPU; builds
#                                       first where Go exists, else uses the prebuilt binaries
#                                       (from the bundle where there is one); FLAGS
#                                       (and $GPUREAL_FLAGS) go to bin/gpureal-bench
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}

build() {
	export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
	GOFLAGS=${GOFLAGS:--buildvcs=false} CGO_ENABLED=1 go build -trimpath -ldflags '-s -w' -o "$BIN/koordlet" ./cmd/koordlet
	GOFLAGS=${GOFLAGS:--buildvcs=false} CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$BIN/gpureal-bench" ./cmd/gpu-real
	tar -czf "$BIN/gpureal-bundle.tar.gz" -C "$BIN" koordlet gpureal-bench
	echo "bench-gpu-real: built $BIN/koordlet, $BIN/gpureal-bench and $BIN/gpureal-bundle.tar.gz"
}

if [ "${1:-}" = build ]; then
	build
	exit 0
fi

# No GPU here: stop before anything else.
if ! compgen -G "/dev/nvidia[0-9]*" >/dev/null && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	echo "bench-gpu-real: no NVIDIA GPU: run on the GPU machine, see docs/benchmarks.md (\"Real GPU: make bench-gpu-real\")" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "bench-gpu-real: run as root (the bench creates cgroups and runs the agent)" >&2
	exit 2
fi

if command -v go >/dev/null 2>&1 && [ "${GPUREAL_PREBUILT:-}" != 1 ]; then
	build
elif [ -f "$BIN/gpureal-bundle.tar.gz" ]; then
	# The carried bundle is what was built for this run: it replaces older binaries.
	tar -xzf "$BIN/gpureal-bundle.tar.gz" -C "$BIN"
fi
for b in "$BIN/koordlet" "$BIN/gpureal-bench"; do
	if [ ! -x "$b" ]; then
		echo "bench-gpu-real: $b is missing and there is no Go here: run 'make bench-gpu-real-build' on a machine with Go and carry $BIN/gpureal-bundle.tar.gz (docs/benchmarks.md)" >&2
		exit 2
	fi
done

# shellcheck disable=SC2086 # GPUREAL_FLAGS is a list of flags
exec "$BIN/gpureal-bench" -agent "$BIN/koordlet" -out bench/out/gpu-real.json ${GPUREAL_FLAGS:-} "$@"
