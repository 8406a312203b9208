#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ for a given time each (built by
# scripts/sanitize.sh --build-only: clang, ASan + UBSan, coverage on the
# parsers), $MOEKIT_JOBS at a time, then the Python target of moekit.r3's
# readers (atheris), and prints the executions per target.
# Each target starts from its seed corpus fuzz/corpus/<target>/ (read only);
# new inputs go to build-asan/fuzz/corpus/<target>/, crashes to
# build-asan/fuzz/crashes/. A crash fails the script: add the input to
# fuzz/corpus/<target>/ once it is fixed, so every build replays it.
#
#   scripts/fuzz.sh                 # 60 s per target, every target
#   scripts/fuzz.sh 600 npy         # 10 minutes on the .npy reader
set -euo pipefail
cd "$(dirname "$0")/.."

readonly SECONDS_PER_TARGET="${1:-60}"
shift || true
if (($#)); then TARGETS=("$@"); else TARGETS=(npy safetensors capture_file layer_file model_layer); fi
readonly BUILD_DIR="${MOEKIT_ASAN_DIR:-build-asan}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly OUT="$BUILD_DIR/fuzz"

MOEKIT_ASAN_DIR="$BUILD_DIR" scripts/sanitize.sh --build-only >/dev/null
mkdir -p "$OUT/crashes" "$OUT/logs"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

run_target() {
  local t=$1
  mkdir -p "$OUT/corpus/$t"
  rm -f "$OUT/crashes/$t-"*
  # -rss_limit_mb: the readers refuse what does not fit; a real allocation past
  # 2 GiB from inputs of at most 64 KiB would be a bug.
  "$BUILD_DIR/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -dict="fuzz/dicts/$t.dict" -artifact_prefix="$OUT/crashes/$t-" \
    "$OUT/corpus/$t" "fuzz/corpus/$t" >"$OUT/logs/$t.log" 2>&1
}

echo "fuzz: ${TARGETS[*]}, ${SECONDS_PER_TARGET} s each, $JOBS at a time"
declare -A pid_of
for t in "${TARGETS[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
  run_target "$t" &
  pid_of[$t]=$!
done
failed=0
printf "%-14s %14s %10s %8s\n" target executions exec/s crashes
for t in "${TARGETS[@]}"; do
  status=0
  wait "${pid_of[$t]}" || status=$?
  log="$OUT/logs/$t.log"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(find "$OUT/crashes" -name "$t-*" -type f | wc -l)
  printf "%-14s %14s %10s %8s\n" "$t" "${runs:-?}" "${rate:-?}" "$crashes"
  if ((status != 0 || crashes != 0)); then
    failed=1
    echo "fuzz: $t failed (exit $status); its log: $log"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -5 || true
  fi
done
# The Python readers of moekit.r3 (fuzz/python/fuzz_r3.py, atheris): run with
# .venv's Python, atheris installed there when missing (it needs a registry).
PY="${MOEKIT_VENV:-.venv}/bin/python"
if [[ -x $PY ]] && { "$PY" -c 'import atheris' 2>/dev/null ||
                     "$PY" -m pip install --quiet --disable-pip-version-check atheris==3.0.0 >/dev/null 2>&1; }; then
  mkdir -p "$OUT/corpus/r3"
  status=0
  "$PY" fuzz/python/fuzz_r3.py -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$OUT/crashes/r3-" "$OUT/corpus/r3" fuzz/corpus/r3 >"$OUT/logs/r3.log" 2>&1 ||
    status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/logs/r3.log" | tail -1)
  printf "%-14s %14s %10s %8s\n" r3.py "${runs:-?}" "-" "$(find "$OUT/crashes" -name 'r3-*' -type f | wc -l)"
  if ((status != 0)); then
    failed=1
    echo "fuzz: r3.py failed (exit $status); its log: $OUT/logs/r3.log"
    grep -E "Uncaught|Error|Test unit written" "$OUT/logs/r3.log" | head -5 || true
  fi
else
  echo "fuzz: r3.py skipped: no $PY with atheris"
fi
exit $failed
