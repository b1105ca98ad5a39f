#!/usr/bin/env bash
# The go/no-go probe of per-context time slices (docs/gpu.md, "Per-context time slices"):
# the standard pair of make bench-gpu-real alone and together, batch's contexts at a short
# slice and LS's at its default, then at a long one, through the time-slice shim; prints
# LS p50/p99 against alone, batch's throughput, what the shim reported (slices asked and
# read back) and a verdict. About 1.5 min on the GPU machine (5 processes start at once,
# then 6 phases of 10 s).
#
#   bench/gpureal/probe-timeslice.sh [FLAGS]   FLAGS go to probe_timeslice.py (--phase,
#                                              --batch-slices 100,500,2048, --ls-long, ...)
#
# It builds nothing: the GPU machine has no compiler. Here: make tsg-shim, then carry
# bin/libunderstory-tsg.so there, e.g. one device call with carry
# ["bin/libunderstory-tsg.so"] and the command
#   PROBE_OUT=$OUT bash bench/gpureal/probe-timeslice.sh 2>&1 | tee $OUT/probe.log
# Environment: PROBE_SHIM (default bin/libunderstory-tsg.so), PROBE_OUT (default
# bench/out/probe-timeslice), PYTHON (python3, the one with PyTorch; the stand-ins run
# under the same interpreter's binary, the shim only in them), PROBE_FAKE=1 (a dry run
# without a GPU: no GPU check, the verdict says it is no result), PROBE_EXTRA_PRELOAD (a
# library preloaded after the shim: the tests' fake driver).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHIM=${PROBE_SHIM:-bin/libunderstory-tsg.so}
OUT=${PROBE_OUT:-bench/out/probe-timeslice}
PY=${PYTHON:-python3}

if [ ! -f "$SHIM" ]; then
	echo "probe-timeslice: $SHIM is missing: run 'make tsg-shim' on a machine with gcc and carry it here" >&2
	exit 2
fi
args=(--shim "$SHIM" --workloads bench/gpureal/workloads --out "$OUT")
if [ "${PROBE_FAKE:-}" = 1 ]; then
	args+=(--fake)
elif ! compgen -G "/dev/nvidia[0-9]*" >/dev/null && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	echo "probe-timeslice: no NVIDIA GPU: run on the GPU machine (PROBE_FAKE=1 for a dry run)" >&2
	exit 2
fi
if [ -n "${PROBE_EXTRA_PRELOAD:-}" ]; then
	args+=(--extra-preload "$PROBE_EXTRA_PRELOAD")
fi

echo "probe-timeslice: kernel $(uname -r) ($(uname -m)); $(head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'no /proc/driver/nvidia/version')"
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>/dev/null || true
exec "$PY" -u bench/gpureal/probe_timeslice.py "${args[@]}" "$@"
