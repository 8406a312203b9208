#!/usr/bin/env bash
# The portable CUDA backend against the sm90 one on a CUDA machine (one process
# per backend, same inputs): builds the GPU benchmark, runs it with
# --backend cuda_sm90 and --backend cuda_sm80 on every shape x M of
# bench/shapes/moe_layers.json, and prints the side-by-side table last
# (bench/results_table.py: "previous" is cuda_sm90, ratios are sm80 / sm90 time).
#
#   scripts/backend_round.sh [RESULTS_DIR]      (default bench/results/latest_backends)
#
# Environment: BUILD_DIR (default build-gpu), SCHEMES (default "bf16"), BENCH_ARGS
# (extra benchmark flags, e.g. "--m 1,16,64 --seconds 0.1"), SM80_VARIANT (space-separated
# --variant values timed interleaved with cuda_sm80's default, default the streaming GEMM
# forced: the A/B behind its large-group rule; empty: none).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
out="${1:-$root/bench/results/latest_backends}"
mkdir -p "$out"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee "$out/device.txt"
if [ ! -x "$build/bench/moekit_gpu_bench" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON -DMOEKIT_DEPS_DIR="$root/.deps" \
    >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
  ninja -C "$build" -j"$(nproc)" moekit_gpu_bench_bin >"$out/build.log" 2>&1 \
    || { grep -E 'error|FAILED' "$out/build.log" | head -20; exit 1; }
  echo "[backends] build ok in $(( $(date +%s) - t0 ))s"
fi
for scheme in ${SCHEMES:-bf16}; do
  for backend in cuda_sm90 cuda_sm80; do
    variant=()
    if [ "$backend" = cuda_sm80 ]; then
      for v in ${SM80_VARIANT-streaming:MOEKIT_SM90_GEMM=streaming}; do variant+=(--variant "$v"); done
    fi
    # shellcheck disable=SC2086
    (cd "$root" && "$build/bench/moekit_gpu_bench" --shapes bench/shapes/moe_layers.json --scheme "$scheme" \
       --backend "$backend" --no-capture-modes "${variant[@]}" --json "$out/${backend}_$scheme.json" ${BENCH_ARGS:-}) \
      >"$out/${backend}_$scheme.log" 2>&1
    echo "[backends] $scheme $backend rc=$? at $(( $(date +%s) - t0 ))s"
  done
done
for scheme in ${SCHEMES:-bf16}; do
  echo "== $scheme: cuda_sm80 (moekit column) vs cuda_sm90 (previous column)"
  python3 "$root/bench/results_table.py" --moekit "$out/cuda_sm80_$scheme.json" \
    --previous "$out/cuda_sm90_$scheme.json" | tee "$out/table_$scheme.txt"
done
for scheme in ${SCHEMES:-bf16}; do
  echo "== $scheme: cuda_sm80's default against its variant, timed interleaved (ratio: variant / default)"
  python3 - "$out/cuda_sm80_$scheme.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
names = [v.split(":")[0] for v in doc.get("variants") or []]
for c in doc["cases"]:
    for i, v in enumerate(c.get("variant_time_us") or []):
        name = names[i] if i < len(names) else f"variant {i}"
        print(f'{c["shape"]:<18} {c["m"]:>6}  default {c["time_us"]:>9.1f} us  {name:<10} {v:>9.1f} us  {v / c["time_us"]:.2f}x')
PY
done
