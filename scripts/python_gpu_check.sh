#!/usr/bin/env bash
# On the GPU machine (no package registry): builds the Python package from what
# is installed there (torch, nanobind, scikit-build-core, CMake, nvcc) plus
# .deps/ (`pip install --no-build-isolation`, CUDA backend on, into a folder of
# its own: the system Python is not touched), then runs the pytest suite with
# the gpu tests, the example on the GPU and the overhead benchmark, and prints
# a short summary last. Exit status 0 only when all of it passed.
#
#   scripts/python_gpu_check.sh      # logs in build-pygpu/ (LOG_DIR), Python: PYTHON (python3)
#   PYTEST_ARGS="-k gpu" scripts/python_gpu_check.sh    # a part of the suite
set -uo pipefail
cd "$(dirname "$0")/.."
readonly ROOT=$PWD
readonly PY=${PYTHON:-python3}
readonly LOG_DIR=${LOG_DIR:-$ROOT/build-pygpu}
readonly SITE=$LOG_DIR/site
mkdir -p "$LOG_DIR"
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi

status() { if [[ $1 == 0 ]]; then echo ok; else echo "FAILED (exit $1)"; fi; }

# pytest: installed, or the wheels scripts/vendor_deps.sh put in .deps/wheels.
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  "$PY" -m pip install --no-index --find-links "$ROOT/.deps/wheels" --target "$LOG_DIR/pytest" pytest \
    > "$LOG_DIR/pytest_install.log" 2>&1
  export PYTHONPATH=$LOG_DIR/pytest${PYTHONPATH:+:$PYTHONPATH}
fi

# nanobind as pinned in pyproject.toml (the machine's own may be another version).
nanobind_args=()
if [[ -f $ROOT/.deps/wheels/nanobind-2.9.2-py3-none-any.whl ]]; then
  "$PY" -m pip install --no-index --no-deps --target "$LOG_DIR/nanobind" "$ROOT/.deps/wheels/nanobind-2.9.2-py3-none-any.whl" \
    > "$LOG_DIR/nanobind_install.log" 2>&1 && nanobind_args=(-C cmake.define.nanobind_DIR="$LOG_DIR/nanobind/nanobind/cmake")
fi

echo "python_gpu_check: building and installing moekit into $SITE (log: $LOG_DIR/install.log)"
rm -rf "$SITE"
"$PY" -m pip install --no-build-isolation --no-deps --target "$SITE" -v "$ROOT" \
  -C build-dir="$LOG_DIR/build" -C cmake.define.MOEKIT_CUDA=ON -C cmake.define.MOEKIT_DEPS_DIR="$ROOT/.deps" \
  "${nanobind_args[@]}" > "$LOG_DIR/install.log" 2>&1
install_rc=$?
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

# The command line for the tests that drive it (test_checkpoints.py): scripts/gpu_check.sh's build, when there.
if [[ -z ${MOEKIT_CLI:-} && -x $ROOT/build-gpu/moekit ]]; then export MOEKIT_CLI=$ROOT/build-gpu/moekit; fi

pytest_rc=1 example_rc=1 bench_rc=1
if ((install_rc == 0)); then
  # From another folder, so `import moekit` is the installed package.
  # PYTEST_ARGS: e.g. "-k 'gpu or transformers'" to run a part of the suite.
  (cd "$LOG_DIR" && eval "\"$PY\" -m pytest \"$ROOT/python/tests\" -rs -p no:cacheprovider ${PYTEST_ARGS:-}") \
    > "$LOG_DIR/pytest.log" 2>&1
  pytest_rc=$?
  (cd "$LOG_DIR" && "$PY" "$ROOT/examples/moe_decoder.py" --device cuda) > "$LOG_DIR/example.log" 2>&1
  example_rc=$?
  (cd "$LOG_DIR" && "$PY" "$ROOT/python/benchmarks/overhead.py" --device cuda) > "$LOG_DIR/overhead.log" 2>&1
  bench_rc=$?
fi

echo
echo "================ python_gpu_check summary ================"
echo "install (pip, CUDA on):   $(status $install_rc)   $(grep -m1 -o 'moekit: CUDA backend [^)]*)' "$LOG_DIR/install.log"); nanobind $(((${#nanobind_args[@]})) && echo '2.9.2 (pinned)' || echo 'of the machine')"
echo "pytest (gpu tests on):    $(status $pytest_rc)   $(tail -n 1 "$LOG_DIR/pytest.log" 2>/dev/null)"
grep -E '^SKIPPED' "$LOG_DIR/pytest.log" 2>/dev/null | head -n 5
echo "example on the GPU:       $(status $example_rc)   $(grep 'bit for bit' "$LOG_DIR/example.log" 2>/dev/null)"
echo "overhead benchmark:       $(status $bench_rc)"
sed -n '1,4p' "$LOG_DIR/overhead.log" 2>/dev/null | sed 's/^/  /'
echo "logs: $LOG_DIR/{install,pytest,example,overhead}.log"
((install_rc == 0 && pytest_rc == 0 && example_rc == 0 && bench_rc == 0))
