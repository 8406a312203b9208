#!/usr/bin/env bash
# The first command: builds only what moekit's main job needs and runs it
# (`moekit run` on its embedded default, or the arguments given). On Debian 12
# it installs the few packages the command line needs when they are missing
# (a compiler, CMake, ninja, OpenBLAS, CLI11, nlohmann-json), configures build/
# without the tests, the benchmarks and the Python package, and builds the one
# `moekit` target. The CUDA backend is built only when a GPU is visible
# (nvidia-smi lists one) and nvcc is found, or when MOEKIT_CUDA=ON asks for it;
# the test command (scripts/test.sh) builds the rest in the same build/. A
# build/ that is already configured (by the test command, say) is kept as it
# is, CUDA setting included, so nothing is rebuilt but the `moekit` target.
#
#   scripts/run.sh                    # build/moekit run
#   scripts/run.sh run --tokens 4096  # any moekit command line
#   MOEKIT_CUDA=ON scripts/run.sh     # the CUDA backend too (needs nvcc)
set -euo pipefail
cd "$(dirname "$0")/.."

readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly PACKAGES=(build-essential cmake ninja-build libopenblas-dev libcli11-dev nlohmann-json3-dev)

missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
fi
if ((${#missing[@]})) && command -v apt-get >/dev/null; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "run: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA only where it can run (or when asked): compiling every sm_90a kernel on a
# machine without a GPU is the test command's job (it keeps them from rotting).
cuda="${MOEKIT_CUDA:-}"
configured=""
[[ -f $BUILD_DIR/CMakeCache.txt ]] && configured=$(sed -n 's/^MOEKIT_CUDA:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
[[ -z $cuda ]] && cuda=$configured
if [[ -z $cuda ]]; then
  cuda=OFF
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
    command -v nvcc >/dev/null && cuda=ON
  fi
fi
if [[ $cuda == ON ]]; then
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  export CUDACXX="${CUDACXX:-$(command -v nvcc)}"
  [[ -f .deps/cutlass/include/cutlass/cutlass.h ]] || scripts/fetch_cutlass.sh
fi
echo "run: building $BUILD_DIR/moekit (CUDA backend: $cuda)"

if [[ -n $configured && $cuda == "$configured" ]]; then
  cmake -S . -B "$BUILD_DIR" >/dev/null  # as configured before: its tests and Python package stay
else
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA="$cuda" -DMOEKIT_PYTHON=OFF \
    -DBUILD_TESTING=OFF -DMOEKIT_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS" --target moekit_cli
if (($#)); then
  exec "$BUILD_DIR/moekit" "$@"
fi
exec "$BUILD_DIR/moekit" run
