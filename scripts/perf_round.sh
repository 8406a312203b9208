#!/usr/bin/env bash
# One performance round on a CUDA machine: builds the GPU benchmark, runs it on
# the balanced data (every shape x M of bench/shapes/moe_layers.json) and on the
# skewed variant, runs the peers on the same data (bench/peer_torch.py, and
# bench/peer_triton.py when present), optionally an Nsight Compute breakdown per
# kernel of a few cases and an A/B of forced GEMM paths, and prints the tables last.
#
#   scripts/perf_round.sh [RESULTS_DIR]            (default bench/results/latest)
#
# Environment:
#   BUILD_DIR    build folder (default build-gpu)
#   SKEW         skew of the second table (default 1.0; 0 skips it)
#   PEERS        peers to run, space-separated: "torch triton vllm" (default "vllm": vLLM's own Triton
#                kernel and configs from .peer/, the bar; bench/peer_triton.py is a weaker home-made one)
#   PEER_BUDGET_S  seconds the vllm peer may spend per table (default 300)
#   PEER_ARGS    extra arguments for the peers (e.g. --tune)
#   NCU_CASES    "shape:M ..." cases whose kernels ncu times one forward of (default none)
#   AB_RUNS      extra benchmark runs comparing forced paths in one process, one per line:
#                "NAME M1,M2 VNAME:VAR=VALUE,VAR=VALUE VNAME2:..." (each variant's graphs are
#                timed interleaved with the default's; bench/NOTES.md)
#   BENCH_ARGS   extra arguments for every benchmark run
#   TESTS        gpu test binaries to build and run first (default none), e.g. "test_layer_cuda"
#   BALANCED_M   M values of the balanced run (default: the shape list's)
#   OVERHEAD     1: also build the Python module in the same build folder and run
#                python/benchmarks/overhead.py (the host cost of an eager forward)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
out="${1:-$root/bench/results/latest}"
skew="${SKEW:-1.0}"
peers="${PEERS:-vllm}"
mkdir -p "$out"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | head -1 | tee "$out/device.txt"

py_args=() py_target=""
if [ "${OVERHEAD:-0}" = 1 ]; then
  py_args=(-DMOEKIT_PYTHON=ON -Dnanobind_DIR="$(python3 -m nanobind --cmake_dir)")
  py_target="_moekit moekit_host_api_costs"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON -DMOEKIT_DEPS_DIR="$root/.deps" \
  "${py_args[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
# shellcheck disable=SC2086
ninja -C "$build" -j"$(nproc)" moekit_gpu_bench_bin ${TESTS:-} $py_target >"$out/build.log" 2>&1 \
  || { grep -E 'error|FAILED' "$out/build.log" | head -20; exit 1; }
echo "[perf] build ok in $(( $(date +%s) - t0 ))s"
bench="$build/bench/moekit_gpu_bench"
for t in ${TESTS:-}; do
  bin="$(find "$build/tests" -name "$t" -type f -perm -u+x | head -1)"
  "$bin" >"$out/$t.log" 2>&1
  echo "[perf] $t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | paste -sd' ')" | tee -a "$out/tests.txt"
  grep -E '^\[  FAILED  \]' "$out/$t.log" | sort -u | head -n 6 | tee -a "$out/tests.txt"
done
shapes="$root/bench/shapes/moe_layers.json"
if [ -n "$py_target" ]; then
  "$build/bench/moekit_host_api_costs" >"$out/overhead_runtime_calls.log" 2>&1
  for tokens in 1 64; do
    (cd "$out" && PYTHONPATH="$build/python" python3 "$root/python/benchmarks/overhead.py" --device cuda --tokens $tokens) \
      >"$out/overhead_m$tokens.log" 2>&1
    echo "[perf] overhead M=$tokens rc=$?"
  done
fi

# ---- the benchmark, balanced then skewed, with output dumps for the peers' checks
run_bench() {  # tag, extra args...
  local tag="$1"; shift
  local dump=()
  case " $peers " in  # outputs for the torch/triton peers' check (bf16 only)
    *" torch "*|*" triton "*) dump=(--dump-dir "$out/dumps_$tag" --dump-m 1 64 4096); mkdir -p "$out/dumps_$tag" ;;
  esac
  case " ${BENCH_ARGS:-} " in *" --scheme fp8"*) dump=() ;; esac
  # shellcheck disable=SC2086
  "$bench" --shapes "$shapes" --json "$out/moekit_$tag.json" "${dump[@]}" \
    ${BENCH_ARGS:-} "$@" >"$out/moekit_$tag.log" 2>&1
  echo "[perf] moekit $tag rc=$? ($(( $(date +%s) - t0 ))s)"
}
# shellcheck disable=SC2046
run_bench balanced ${BALANCED_M:+--m $BALANCED_M}
[ "$skew" != "0" ] && run_bench skewed --skew "$skew"

# ---- peers on the same data. "vllm": the vLLM Triton harness, when a copy of it
# sits in .peer/ (git-ignored; its README says how it gets there).
for peer in $peers; do
  if [ "$peer" = vllm ]; then
    [ -f "$root/.peer/run_peers.py" ] || { echo "[perf] no .peer/run_peers.py"; continue; }
    for tag in balanced skewed; do
      [ -f "$out/moekit_$tag.json" ] || continue
      left=$(( ${PEER_BUDGET_S:-300} ))
      # shellcheck disable=SC2086
      (cd "$root/.peer" && PYTHONUNBUFFERED=1 timeout $(( left + 60 )) python3 run_peers.py \
        --moekit-json "$out/moekit_$tag.json" --project-bench "$root/bench" --out "$out/vllm_$tag.json" \
        --budget-s "$left" ${PEER_ARGS:-}) >"$out/vllm_$tag.log" 2>&1
      echo "[perf] peer vllm $tag rc=$? ($(( $(date +%s) - t0 ))s)"
    done
    continue
  fi
  script="$root/bench/peer_$peer.py"
  [ -f "$script" ] || { echo "[perf] no $script"; continue; }
  for tag in balanced skewed; do
    [ -f "$out/moekit_$tag.json" ] || continue
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout 900 python3 "$script" --moekit-json "$out/moekit_$tag.json" --dump-dir "$out/dumps_$tag" \
      --json "$out/${peer}_$tag.json" ${PEER_ARGS:-} >"$out/${peer}_$tag.log" 2>&1
    echo "[perf] peer $peer $tag rc=$? ($(( $(date +%s) - t0 ))s)"
  done
done

# ---- A/B runs: variants timed interleaved with the default, in one process each
while read -r name ms specs; do
  [ -n "${name:-}" ] || continue
  vargs=()
  for v in $specs; do vargs+=(--variant "$v"); done
  # shellcheck disable=SC2046,SC2086
  "$bench" --shapes "$shapes" --m $(echo "$ms" | tr ',' ' ') "${vargs[@]}" --json "$out/ab_$name.json" ${BENCH_ARGS:-} \
    >"$out/ab_$name.log" 2>&1
  echo "[perf] A/B $name rc=$? ($(( $(date +%s) - t0 ))s)"
done <<< "${AB_RUNS:-}"

# ---- kernel breakdown of a few cases: one eager forward, every kernel of the layer
if [ -n "${NCU_CASES:-}" ] && command -v ncu >/dev/null; then
  for c in $NCU_CASES; do
    shape="${c%%:*}"; m="${c##*:}"
    # shellcheck disable=SC2086
    ncu --clock-control none --kernel-name regex:'align|finalize|gather|activation|prefix|setup|streaming|routing|device_kernel|moe_|quant|amax' \
      --launch-count 16 --csv --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
      "$bench" --shapes "$shapes" --only "$shape" --m "$m" --sets 1 --seconds 0 --min-reps 1 --read-gib 4 --matmul-n 2048 ${BENCH_ARGS:-} \
      >"$out/ncu_${shape}_m$m.csv" 2>"$out/ncu_${shape}_m$m.err"
    echo "[perf] ncu $shape M=$m rc=$?"
  done
fi

echo
echo "==== perf round ($(( $(date +%s) - t0 ))s) on $(cat "$out/device.txt") ===="
[ -f "$out/tests.txt" ] && cat "$out/tests.txt"
for f in "$out"/overhead_*.log; do [ -f "$f" ] && { echo "-- $(basename "$f" .log)"; cat "$f"; }; done
for f in "$out"/ncu_*.csv; do
  [ -f "$f" ] || continue
  echo "-- $(basename "$f" .csv): kernel, us, dram%, grid, regs, warps%"
  python3 - "$f" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit()
h = rows[0]; idx = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:40])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
seen = 0
for (i, name), m in k.items():
    if seen >= 14: break
    seen += 1
    t = float(m.get("gpu__time_duration.sum", "0").replace(",", "")) / 1000.0
    print(f"   {name:<40} {t:9.1f} {m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed','-'):>6} "
          f"{m.get('launch__grid_size','-'):>7} {m.get('launch__registers_per_thread','-'):>4} "
          f"{m.get('sm__warps_active.avg.pct_of_peak_sustained_active','-'):>6}")
PY
done
for ab in "$out"/ab_*.log; do [ -f "$ab" ] && { echo "-- $(basename "$ab" .log) (variant time / default time, output diff)"; grep -E '^(shape|\S+ +[0-9]+ )' "$ab" | awk '{printf "   %-18s %6s %9s %7s", $1, $2, $3, $10; for (i = 13; i <= NF; ++i) printf " %s", $i; printf "\n"}'; }; done
for tag in balanced skewed; do
  [ -f "$out/moekit_$tag.log" ] || continue
  echo "-- moekit $tag"; grep -E '^(ceilings|shape|\S+ +[0-9]+ )' "$out/moekit_$tag.log" | tail -n 30
  for peer in $peers; do
    [ -f "$out/${peer}_$tag.log" ] && { echo "-- $peer $tag"; grep -vE '^  ' "$out/${peer}_$tag.log" | tail -n 36; }
  done
done
