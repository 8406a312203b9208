#!/usr/bin/env bash
# Sets up and builds moekit on Debian 12: installs the packages the build needs
# (when missing and apt-get is there), makes the Python virtual environment
# .venv/ (torch and the binding stack of python/requirements.txt, from PyPI),
# configures with CMake + Ninja (Release) and builds everything into build/:
# the `moekit` binary (build/moekit) and the Python package (build/python/moekit,
# which .venv imports: `.venv/bin/python -c 'import moekit'`). The CUDA backend
# is built too when nvcc is found (PATH or /usr/local/cuda).
#
#   scripts/setup.sh                       # build/ with all cores
#   MOEKIT_BUILD_DIR=b MOEKIT_JOBS=2 MOEKIT_VENV=v scripts/setup.sh
#   MOEKIT_PYTHON=OFF scripts/setup.sh     # the C++ only: no .venv, no module
#
# Without apt-get (e.g. the GPU machine), the dependencies come from .deps/
# (scripts/vendor_deps.sh); the Python package there: scripts/python_gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly VENV="${MOEKIT_VENV:-.venv}"
readonly PYTHON_PACKAGE="${MOEKIT_PYTHON:-ON}"
readonly PACKAGES=(build-essential cmake ninja-build libopenblas-dev libcli11-dev nlohmann-json3-dev
                   libgtest-dev libbenchmark-dev)

missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
fi
# A venv needs Debian's python3-venv, the module Python's headers (python3-dev),
# unless python3 already brings both (e.g. a Python built from source).
if [[ $PYTHON_PACKAGE == ON ]] && command -v dpkg-query >/dev/null &&
   ! python3 -c 'import ensurepip, os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null; then
  missing+=(python3-venv python3-dev)
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

python_args=(-DMOEKIT_PYTHON=OFF)
if [[ $PYTHON_PACKAGE == ON ]]; then
  # torch comes from PyPI: its CUDA wheel (about 4.7 GB installed), which also runs on a CPU-only machine.
  # No pip cache: it would keep a second copy of those gigabytes on disk.
  [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
  echo "setup: Python packages of python/requirements.txt into $VENV/ ($(df -h --output=avail . | tail -1 | tr -d ' ') free on disk)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r python/requirements.txt
  python_args=(-DMOEKIT_PYTHON=ON "-DPython_EXECUTABLE=$PWD/$VENV/bin/python")
fi

# Everything: the cache of a build/ that scripts/run.sh configured (no tests, no
# benchmarks, CUDA only with a GPU) is overridden.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA="${MOEKIT_CUDA:-AUTO}" \
  -DBUILD_TESTING=ON -DMOEKIT_BUILD_BENCH=ON "${python_args[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "setup: built $BUILD_DIR/moekit"
if [[ $PYTHON_PACKAGE == ON ]]; then
  # The venv imports the package this build staged (no second build of the library).
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$(cd "$BUILD_DIR" && pwd)/python" > "$site/moekit-build.pth"
  echo "setup: Python package moekit ($BUILD_DIR/python/moekit) installed in $VENV/ (import moekit with $VENV/bin/python)"
fi
