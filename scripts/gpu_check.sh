#!/usr/bin/env bash
# moekit on a CUDA machine, from a fresh checkout: configure Release against the
# vendored dependencies (.deps, made by scripts/vendor_deps.sh), build with all
# cores, run the gpu-labelled tests (again with the reference grouped GEMM
# forced), run compute-sanitizer memcheck/racecheck/initcheck on a small
# subset, and print a one-screen summary last.
#
#   scripts/gpu_check.sh                  # build dir build-gpu, logs in build-gpu/gpu_check
#   BUILD_DIR=/tmp/b LOG_DIR=/tmp/logs scripts/gpu_check.sh
#
# Exit status 0 only when the build, every gpu test and every sanitizer run pass.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
LOGS="${LOG_DIR:-$BUILD/gpu_check}"
JOBS="$(nproc)"
mkdir -p "$LOGS"
declare -a SUMMARY=()
FAILED=0
note() { SUMMARY+=("$1"); echo "[gpu_check] $1"; }  # progress as it goes; the summary repeats it last
fail() { SUMMARY+=("FAIL  $1"); FAILED=1; echo "[gpu_check] FAIL  $1"; }

start=$(date +%s)
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
note "device   ${gpu:-none visible}; $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc')"

# ---- configure + build (-k 0: a target that fails to build is reported, the rest still run)
t0=$(date +%s)
if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
     -DMOEKIT_DEPS_DIR="$ROOT/.deps" >"$LOGS/configure.log" 2>&1; then
  grep -E 'Error|error' -A3 "$LOGS/configure.log" | head -n 20
  fail "configure (see $LOGS/configure.log)"
  printf '\n==== moekit gpu_check summary ====\n'; printf '%s\n' "${SUMMARY[@]}"; echo "RESULT   FAIL"; exit 1
fi
# shellcheck disable=SC2086  # GPU_CHECK_TARGETS: optional space-separated targets (default: all)
if ninja -C "$BUILD" -k 0 -j"$JOBS" ${GPU_CHECK_TARGETS:-} >"$LOGS/build.log" 2>&1; then
  note "build    ok in $(( $(date +%s) - t0 ))s (-j$JOBS, Release, $(grep -c 'Building CUDA object' "$LOGS/build.log") CUDA objects)"
else
  fail "build    $(grep -c '^FAILED' "$LOGS/build.log") target(s) failed in $(( $(date +%s) - t0 ))s: $(grep '^FAILED' "$LOGS/build.log" | awk '{print $2}' | xargs -n1 basename | head -n 4 | paste -sd' ')"
  grep -E ' error' "$LOGS/build.log" | sort -u | head -n 6 | cut -c1-200
fi

# ---- gpu tests (the table's default GEMM paths), then with the reference GEMM forced
run_ctest() {  # label, name, log, extra env...
  local LABEL="$1" name="$2" log="$3"; shift 3
  ( cd "$BUILD" && env "$@" ctest -L "$LABEL" -V -j4 --timeout 300 ) >"$log" 2>&1
  local rc=$?
  local line; line="$(grep -E 'tests passed|tests failed' "$log" | tail -1)"
  local skipped; skipped="$(grep -cE 'Test +#[0-9]+: .*(Skipped|Not Run)' "$log" || true)"
  if [ $rc -eq 0 ]; then note "$name $line (ctest entries skipped: $skipped)"; else fail "$name $line"; fi
  grep -E '^\s*[0-9]+/[0-9]+ Test' "$log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /         /' | sed -E 's/ \.+/ /'
}
run_ctest gpu "gpu      " "$LOGS/ctest_gpu.log" MOEKIT_GPU_CHECK=1 >"$LOGS/ctest_gpu.lines"
run_ctest gpu "gpu(ref) " "$LOGS/ctest_gpu_reference.log" MOEKIT_SM90_GEMM=reference >/dev/null
# The portable backend (cuda_sm80) forced: the tests' kernels are its classes.
run_ctest gpu "gpu(sm80)" "$LOGS/ctest_gpu_sm80.log" MOEKIT_TEST_CUDA_BACKEND=cuda_sm80 >/dev/null
# ... and from its PTX alone (what a GPU newer than its SASS runs): the driver
# compiles every kernel on first use; the first test's time includes that.
ptx_t0=$(date +%s)
if CUDA_FORCE_PTX_JIT=1 MOEKIT_TEST_CUDA_BACKEND=cuda_sm80 "$BUILD/tests/cuda/test_layer_cuda" \
     --gtest_filter='Sm90/CudaLayerGrid.*' >"$LOGS/ptx_jit_layer.log" 2>&1; then
  note "ptx jit  layer grid on cuda_sm80 from PTX: $(grep -E '^\[  PASSED  \]' "$LOGS/ptx_jit_layer.log") in $(( $(date +%s) - ptx_t0 ))s; first case $(grep -m1 -oE 'OK \] .* \([0-9]+ ms\)' "$LOGS/ptx_jit_layer.log" | grep -oE '[0-9]+ ms')"
else
  fail "ptx jit  layer grid on cuda_sm80 from PTX: $(grep -cE '^\[  FAILED  \]' "$LOGS/ptx_jit_layer.log") failed lines (see $LOGS/ptx_jit_layer.log)"
fi
run_ctest unit "unit     " "$LOGS/ctest_unit.log" >/dev/null
# Two or more GPUs and NCCL; each test skips itself (counted as skipped) on one GPU.
run_ctest multigpu "multigpu " "$LOGS/ctest_multigpu.log"
passed="$(grep -hoE '\[  PASSED  \] [0-9]+' "$LOGS/ctest_gpu.log" | awk '{s+=$4} END {print s+0}')"
failed="$(grep -hoE '\[  FAILED  \] [0-9]+ tests?, listed' "$LOGS/ctest_gpu.log" | awk '{s+=$4} END {print s+0}')"
skipped="$(grep -hoE '\[  SKIPPED \] [0-9]+ tests?, listed' "$LOGS/ctest_gpu.log" | awk '{s+=$4} END {print s+0}')"
note "         gtest cases of the gpu binaries (default GEMM paths): $passed passed, $failed failed, $skipped skipped"
for f in "$LOGS"/ctest_gpu*.log; do
  grep -E '^\[  FAILED  \]' "$f" | sort -u | head -n 8 | sed "s|^|         $(basename "$f"): |"
done

# ---- the main job on its embedded default: the oracle must pick the GPU, and the replay must match
if ( cd "$LOGS" && "$BUILD/moekit" run ) >"$LOGS/moekit_run.log" 2>&1; then
  note "run      ok: $(grep -E '^backend:' "$LOGS/moekit_run.log" | cut -c11- | head -1); $(grep -E '^device:' "$LOGS/moekit_run.log" | cut -c11-)"
  grep -E '^(run|replay): ' "$LOGS/moekit_run.log" | sed 's/^/         /'
else
  fail "run      moekit run failed: $(tail -n 2 "$LOGS/moekit_run.log" | paste -sd' ')"
fi

# ---- compute-sanitizer on a small subset
T="$BUILD/tests/cuda"
san() {  # tool, label, binary, filter, extra env...
  local tool="$1" label="$2" bin="$3" filter="$4" log="$LOGS/sanitizer_${1}_${2}.log"; shift 4
  # NOTE: on the CUTLASS path initcheck flags reads of what TMA wrote (CUTLASS's descriptor
  # copies, the rows its epilogue stored) although the gpu tests poison those outputs with
  # NaN and compare every element with fp64: we read it as the tool not tracking bulk-async
  # writes (docs/cuda_backend.md, open findings). initcheck therefore runs with the reference
  # grouped GEMM forced (plain stores; the streaming kernel cannot take every test shape, and
  # where it cannot the table falls back to CUTLASS); memcheck and racecheck cover the
  # table's own paths.
  local env=("$@")
  [ "$tool" = initcheck ] && env+=(MOEKIT_SM90_GEMM=reference)
  timeout "${SANITIZER_TIMEOUT:-90}" env "${env[@]}" "$SANITIZER" --tool "$tool" --error-exitcode 97 "$T/$bin" \
    --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local errs; errs="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  local tests; tests="$(grep -E '^\[  PASSED  \]' "$log" | grep -o '[0-9]* test' | head -1)"
  if [ $rc -eq 0 ]; then note "$(printf '%-9s %-9s %-26s' "$tool" ok "$label") ${errs:-no summary} (${tests:-0 test}s passed)"
  else fail "$(printf '%-9s rc=%-6s %-26s' "$tool" "$rc" "$label") ${errs:-see $log}"; fi
}
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)"
if [ -n "$SANITIZER" ]; then
  ROUTE='Sm90/CudaRoutingGrid.*/*_M1_E64_k2_f32_*:Sm90/CudaRoutingGrid.*/deepseek_v3_M513_E64_k8_bf16_g8_4_bias:CudaRouting.*'
  LAYER='Sm90/CudaLayerGrid.*/M1_*:Sm90/CudaLayerGrid.*/M3_*:Sm90/CudaLayerGrid.*/M64_E128*:CudaLayer.InvalidIds*:CudaLayer.WorkspaceReuse*'
  for tool in memcheck racecheck initcheck; do
    san "$tool" routing test_routing_cuda "$ROUTE"
    san "$tool" layer test_layer_cuda "$LAYER"
    san "$tool" graph test_graph_cuda '*'
  done
  san memcheck capture test_capture_cuda '*/renormalize_*:*/deepseek_v3_*'
  san memcheck layer_sm80 test_layer_cuda "$LAYER" MOEKIT_TEST_CUDA_BACKEND=cuda_sm80
  san racecheck layer_sm80 test_layer_cuda "$LAYER" MOEKIT_TEST_CUDA_BACKEND=cuda_sm80
  san racecheck capture test_capture_cuda '*/renormalize_*'
  # Every CUTLASS tile of both families, forced, on two CUTLASS-size cases.
  TILES='Shapes/GroupedGemmSm90.CutlassTilesMatchFp64/11:Shapes/GroupedGemmSm90.CutlassTilesMatchFp64/12'
  san memcheck gemm_tiles ../experts/test_grouped_gemm_sm90 "$TILES"
  san racecheck gemm_tiles ../experts/test_grouped_gemm_sm90 "$TILES"
  # The fp8 mma.sync GEMM (both operand kinds, both tiles: 128 rows at M = 300, 32 at M = 37)
  # on its multi-tile and partial-block shapes.
  FP8MMA='Sm90/CudaFp8Grid.*/mma_sync_*_M300_*:Sm90/CudaFp8Grid.*/mma_sync_*_M37_*'
  san memcheck fp8_mma test_fp8_cuda "$FP8MMA"
  san racecheck fp8_mma test_fp8_cuda "$FP8MMA"
else
  fail "compute-sanitizer not found"
fi

printf '\n==== moekit gpu_check summary (%ss) ====\n' "$(( $(date +%s) - start ))"
printf '%s\n' "${SUMMARY[@]}"
echo "         per-test times:"; cat "$LOGS/ctest_gpu.lines" 2>/dev/null
echo "         layer grid, Sm90Modular ‖out−ref‖/‖ref‖ (Sm90Monolithic is bitwise equal):"
grep -ho '\[ layer .*' "$LOGS/ctest_gpu.log" 2>/dev/null | sed 's/^\[ layer    \] /         /' | head -n 12
[ $FAILED -eq 0 ] && echo "RESULT   PASS" || echo "RESULT   FAIL"
exit $FAILED
