#!/usr/bin/env bash
# The 4-bit weights on a CUDA machine: builds the 4-bit tests and the GPU
# benchmark, runs the tests, then the benchmark on balanced data for bf16,
# fp8-block and the 4-bit schemes (one process each, back to back on one GPU),
# mxfp4 and int4_g128 with each of their 4-bit GEMM paths forced, and prints the
# 4-bit tables last (bench/weight4_table.py).
#
#   scripts/weight4_round.sh [RESULTS_DIR]     (default bench/results/latest)
#
# Environment: BUILD_DIR (default build-gpu), SCHEMES (default "bf16 fp8-block
# mxfp4 int4_g128"), M (token counts, default the shape list's), TESTS (test
# binaries, default the 4-bit ones and their neighbours), BENCH_ARGS (extra
# benchmark arguments), SKIP_TESTS=1, SKIP_BENCH=1, PATHS_M (token counts at
# which the paths are forced, default "64 256 1024 4096"; empty skips them),
# PATH_RUNS (scheme:path pairs forced, default every path of mxfp4 and int4_g128).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
out="${1:-$root/bench/results/latest}"
schemes="${SCHEMES:-bf16 fp8-block mxfp4 int4_g128}"
tests="${TESTS:-test_weight4_cuda test_cpu_weight4 test_fp8_cuda test_layer_cuda oracle_test}"
paths_m="${PATHS_M-64 256 1024 4096}"
mkdir -p "$out"
fail=0

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
  -DMOEKIT_DEPS_DIR="$root/.deps" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
t0=$(date +%s)
# shellcheck disable=SC2086
if ! ninja -C "$build" -j"$(nproc)" moekit_gpu_bench_bin $tests >"$out/build.log" 2>&1; then
  grep -E ' error|FAILED' "$out/build.log" | head -20
  exit 1
fi
echo "build ok in $(( $(date +%s) - t0 ))s"

if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  for t in $tests; do
    bin="$(find "$build/tests" -type f -name "$t" -perm -u+x | head -1)"
    if "$bin" >"$out/$t.txt" 2>&1; then
      echo "test $t: $(grep -E '^\[  PASSED  \]' "$out/$t.txt" | tail -1)"
    else
      fail=1
      echo "test $t FAILED:"; grep -E '^\[  FAILED  \]|Failure' "$out/$t.txt" | head -20
    fi
  done
  grep -E '^\[ weight4' "$out/test_weight4_cuda.txt" > "$out/weight4_errors.txt" 2>/dev/null || true
fi

if [[ ${SKIP_BENCH:-0} != 1 ]]; then
  bench="$(find "$build/bench" -type f -name moekit_gpu_bench -perm -u+x | head -1)"
  m_args=()
  [[ -n ${M:-} ]] && m_args=(--m $M)
  for s in $schemes; do
    only=()
    # int4_g128 needs H and I in groups of 128: gpt-oss-120b-like (2880) is not one.
    [[ $s == int4_g128 ]] && only=(--only mixtral-8x7b qwen3-30b-a3b deepseek-v3)
    # shellcheck disable=SC2086
    "$bench" --scheme "$s" --json "$out/$s.json" "${only[@]}" "${m_args[@]}" ${BENCH_ARGS:-} >"$out/$s.txt" 2>&1 || {
      fail=1; echo "bench $s failed:"; tail -5 "$out/$s.txt"; }
  done
  if [[ -n $paths_m ]]; then
    # Each 4-bit GEMM path forced, in its own process (their workspaces differ).
    for run in ${PATH_RUNS:-mxfp4:streaming mxfp4:dequant int4_g128:streaming int4_g128:mixed int4_g128:dequant}; do
      s=${run%%:*} path=${run#*:} only=()
      [[ $s == int4_g128 ]] && only=(--only mixtral-8x7b qwen3-30b-a3b deepseek-v3)
      # shellcheck disable=SC2086
      MOEKIT_SM90_W4_GEMM=$path "$bench" --scheme "$s" --m $paths_m --json "$out/${s}_$path.json" "${only[@]}" \
        ${BENCH_ARGS:-} >"$out/${s}_$path.txt" 2>&1 || { fail=1; echo "bench $run failed:"; tail -5 "$out/${s}_$path.txt"; }
    done
  fi
  python3 "$root/bench/weight4_table.py" "$out"
fi
exit $fail
