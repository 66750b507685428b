#!/bin/sh
# device-check.sh — on a machine that has a GPU: build kvsim with the CUDA
# backend (or HIP: `scripts/device-check.sh hip`), make sure the backend sees a
# device, run the conformance suite against the CPU reference, then
# `kvsim bench kernels --backend <b> --json FILE`. Exits non-zero on any mismatch,
# on a missing device, or on a failed step; prints where the logs are.
#
#   scripts/device-check.sh [cuda|hip] [build-dir]
#   OUT=results/ scripts/device-check.sh        # where logs and the JSON go
#   KV_CUDA_ARCHS=90 scripts/device-check.sh    # only the GPU's own arch: faster build
set -eu

BACKEND=${1:-cuda}
BUILD=${2:-build-device}
OUT=${OUT:-$BUILD/device-check}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}

case "$BACKEND" in
cuda | hip) ;;
*)
    echo "device-check: backend must be cuda or hip, got '$BACKEND'" >&2
    exit 2
    ;;
esac

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

step() { printf '\n== device-check: %s\n' "$*"; }
die() {
    echo "device-check: FAILED: $*" >&2
    echo "device-check: logs in $OUT" >&2
    exit 1
}

step "packages (scripts/setup.sh)"
sh scripts/setup.sh || die "missing packages (scripts/setup.sh printed the command to install them)"

step "configure ($BUILD)"
ARCH_ARGS=""
if [ -n "${KV_CUDA_ARCHS:-}" ]; then ARCH_ARGS="-DKV_CUDA_ARCHS=$KV_CUDA_ARCHS"; fi
if [ -n "${KV_HIP_ARCHS:-}" ]; then ARCH_ARGS="$ARCH_ARGS -DKV_HIP_ARCHS=$KV_HIP_ARCHS"; fi
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release $ARCH_ARGS >"$OUT/configure.log" 2>&1 ||
    die "cmake configure (see $OUT/configure.log)"
grep -E "^-- (opencl|cuda|hip|ascend):|backends built" "$OUT/configure.log" || true
grep -q "^-- $BACKEND: found" "$OUT/configure.log" || die "CMake did not build the $BACKEND backend (toolkit not found)"

step "build"
cmake --build "$BUILD" -j "$JOBS" >"$OUT/build.log" 2>&1 || die "build (see $OUT/build.log)"

step "$BACKEND sees a device"
"$BUILD/tests/test_backend_vendors" --verbose=0 -j1 --filter="vendors/${BACKEND}_device" >"$OUT/device.log" 2>&1 ||
    die "vendors/${BACKEND}_device (see $OUT/device.log)"
grep -E "^(skipped: )?$BACKEND: " "$OUT/device.log" || true
if grep -q "skipped: $BACKEND" "$OUT/device.log" || ! grep -q "^$BACKEND: [0-9]* device" "$OUT/device.log"; then
    die "$BACKEND has no usable device here"
fi

step "conformance suite (every backend with a device against the CPU reference)"
"$BUILD/tests/test_conformance" --verbose=1 -j1 >"$OUT/conformance.log" 2>&1 || {
    grep -E "FAIL|differs|Synthesis" "$OUT/conformance.log" | head -40
    die "conformance (see $OUT/conformance.log)"
}
grep -E "under test|skipped|Synthesis" "$OUT/conformance.log"
if grep -q "skipped: $BACKEND" "$OUT/conformance.log"; then
    die "the conformance suite skipped $BACKEND"
fi

step "kvsim bench kernels --backend $BACKEND --json"
"$BUILD/kvsim" bench kernels --backend "$BACKEND" --json "$OUT/bench_$BACKEND.json" >"$OUT/bench.txt" 2>&1 || {
    cat "$OUT/bench.txt"
    die "kvsim bench kernels (see $OUT/bench.txt)"
}
cat "$OUT/bench.txt"
if grep -q "OFF BY" "$OUT/bench.txt"; then
    die "kvsim bench kernels reports a mismatch against the CPU reference"
fi

step "all checks passed on $BACKEND; logs and bench_$BACKEND.json in $OUT"
