#!/usr/bin/env bash
# Sets up and builds moekit on Debian 12: installs the packages the build needs
# (when missing and apt-get is there), configures with CMake + Ninja (Release)
# and builds everything into build/ (the `moekit` binary is build/moekit).
# The CUDA backend is built too when nvcc is found (PATH or /usr/local/cuda).
#
#   scripts/setup.sh                       # build/ with all cores
#   MOEKIT_BUILD_DIR=b MOEKIT_JOBS=2 scripts/setup.sh
#
# Without apt-get (e.g. the GPU machine), the dependencies come from .deps/
# (scripts/vendor_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly PACKAGES=(build-essential cmake ninja-build libopenblas-dev libcli11-dev nlohmann-json3-dev
                   libgtest-dev libbenchmark-dev)

missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
fi
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null; then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "setup: no apt-get; using the vendored dependencies in .deps/ for ${missing[*]}"
  fi
fi

# nvcc: on PATH, or CUDA's default prefix.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if command -v nvcc >/dev/null; then
  export CUDACXX="${CUDACXX:-$(command -v nvcc)}"
  echo "setup: nvcc found ($CUDACXX): building the CUDA backend too"
  # The CUDA build compiles the CUTLASS grouped GEMMs too, so they cannot rot.
  [[ -f .deps/cutlass/include/cutlass/cutlass.h ]] || scripts/fetch_cutlass.sh
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: built $BUILD_DIR/moekit"
