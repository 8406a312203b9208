#!/usr/bin/env bash
# Sets up and builds moekit (scripts/setup.sh), then runs the tests: the C++
# `unit` label (CPU) and `gpu` label (each gpu test skips itself, reported as
# skipped, when no CUDA device is present), then the installed C++ package
# (scripts/check_cpp_package.sh: find_package(moekit) and examples/cpp), the Python package's pytest
# suite in .venv (its gpu tests skip the same way), then the same suite against
# a wheel that `pip install .` built (scripts/check_wheel.sh, CPU backend), with
# the newest numpy, torch and transformers on PyPI (.venv has the pinned ones), then
# moekit inside the real vLLM (scripts/setup_vllm.sh's .venv-vllm, the CPU build of
# vLLM 0.32: python/tests/test_vllm.py; MOEKIT_VLLM_TESTS=OFF leaves it out). Every
# part always runs; exits non-zero when any had a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

"./scripts/setup.sh"
readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly VENV="${MOEKIT_VENV:-.venv}"

cpp=0
(cd "$BUILD_DIR" && ctest --output-on-failure --label-regex '^(unit|gpu)$' -j "$JOBS") || cpp=$?
py=0 wheel=0 vllm=0 pkg=0
if [[ ${MOEKIT_PYTHON:-ON} == ON ]]; then
  ./scripts/check_cpp_package.sh || pkg=$?  # find_package(moekit) and examples/cpp (its model folder needs .venv)
  # -rs: every skipped test is listed with its reason (test_vllm.py's, where vLLM is not installed).
  "$VENV/bin/python" -m pytest python/tests -q -rs -p no:cacheprovider || py=$?
  ./scripts/check_wheel.sh || wheel=$?
  if [[ ${MOEKIT_VLLM_TESTS:-ON} == ON ]]; then
    { ./scripts/setup_vllm.sh &&
      .venv-vllm/bin/python -m pytest python/tests/test_vllm.py -q -rs -p no:cacheprovider &&
      .venv-vllm/bin/python -m pytest python/tests/test_docs.py -k vllm -q -rs -p no:cacheprovider; } || vllm=$?  # docs/vllm.md's blocks
  else
    echo "test: vLLM tests left out (MOEKIT_VLLM_TESTS=OFF)"
  fi
fi
echo "test: C++ tests exit $cpp, C++ package exit $pkg, Python tests exit $py, wheel check exit $wheel, vLLM tests exit $vllm"
((cpp == 0 && pkg == 0 && py == 0 && wheel == 0 && vllm == 0))
