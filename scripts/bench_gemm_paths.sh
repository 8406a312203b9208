#!/usr/bin/env bash
# A/B of the Hopper grouped GEMM paths on a CUDA machine: builds the grouped
# GEMM test, the layer test and the GPU benchmark, runs both tests, then the
# benchmark once per forced path (MOEKIT_SM90_GEMM / MOEKIT_SM90_CUTLASS /
# default table) over the M values given, and prints one table last:
# time and % of floor per shape and M for every variant.
#
#   scripts/bench_gemm_paths.sh [RESULTS_DIR] [M values...]     (default M: 64 256 1024 4096 16384)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
out="${1:-$root/bench/results/latest_paths}"
shift $(( $# > 0 ? 1 : 0 ))
ms=("$@")
[ ${#ms[@]} -gt 0 ] || ms=(64 256 1024 4096 16384)
mkdir -p "$out"
t0=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON -DMOEKIT_DEPS_DIR="$root/.deps" \
  >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
ninja -C "$build" -j"$(nproc)" test_grouped_gemm_sm90 test_layer_cuda moekit_gpu_bench_bin >"$out/build.log" 2>&1 \
  || { grep -E 'error|FAILED' "$out/build.log" | head -20; exit 1; }
echo "[paths] build ok in $(( $(date +%s) - t0 ))s"
"$build/tests/experts/test_grouped_gemm_sm90" >"$out/test_grouped_gemm.log" 2>&1
echo "[paths] test_grouped_gemm_sm90 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_grouped_gemm.log" | head -3 | paste -sd' ')"
grep -E '^\[  FAILED  \]|Failure|rel_l2|error' "$out/test_grouped_gemm.log" | head -12
"$build/tests/cuda/test_layer_cuda" >"$out/test_layer.log" 2>&1
echo "[paths] test_layer_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_layer.log" | head -3 | paste -sd' ')"
grep -E '^\[  FAILED  \]|Failure' "$out/test_layer.log" | head -8
bench() {  # name, env...
  local name="$1"; shift
  env "$@" "$build/bench/moekit_gpu_bench" --shapes "$root/bench/shapes/moe_layers.json" --m "${ms[@]}" \
    --json "$out/$name.json" >"$out/$name.log" 2>&1
  echo "[paths] bench $name rc=$? at $(( $(date +%s) - t0 ))s"
}
bench m128_n256 MOEKIT_SM90_GEMM=cutlass MOEKIT_SM90_CUTLASS=m128_n256
bench m64_n256 MOEKIT_SM90_GEMM=cutlass MOEKIT_SM90_CUTLASS=m64_n256
bench table
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = [r for r in ("table", "m128_n256", "m64_n256") if os.path.exists(os.path.join(out, r + ".json"))]
data = {r: {(c["shape"], c["m"]): c for c in json.load(open(os.path.join(out, r + ".json")))["cases"]} for r in runs}
keys = sorted({k for r in runs for k in data[r]}, key=lambda k: (k[0], k[1]))
print("%-18s %6s" % ("shape", "M") + "".join("  %22s" % r for r in runs))
for k in keys:
    cells = []
    for r in runs:
        c = data[r].get(k)
        cells.append("  %10.1f us %5.1f%% %3.0fT" % (c["time_us"], 100 * c["frac_floor"], c["tflops"]) if c else "  %22s" % "-")
    print("%-18s %6d" % k + "".join(cells))
PY
