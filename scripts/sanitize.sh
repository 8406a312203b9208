#!/usr/bin/env bash
# The sanitizer job: the CPU library, its unit tests and the fuzz targets built
# with clang 14, AddressSanitizer and UndefinedBehaviorSanitizer (no recovery:
# any finding fails its test) into build-asan/, then the unit tests run there
# (every one, the fuzz corpus replays included). CUDA is left out: the
# sanitizers instrument host code only. Installs clang 14 and its runtimes with
# apt-get when they are missing.
#
#   scripts/sanitize.sh              # build, then ctest -L unit
#   scripts/sanitize.sh --build-only # what scripts/fuzz.sh needs
#   MOEKIT_ASAN_DIR=b MOEKIT_JOBS=2 scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."

readonly BUILD_DIR="${MOEKIT_ASAN_DIR:-build-asan}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
readonly CLANG_PACKAGES=(clang-14 libclang-rt-14-dev llvm-14)

if ! command -v clang++-14 >/dev/null || ! compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ||
   ! command -v llvm-symbolizer-14 >/dev/null; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "sanitize: installing ${CLANG_PACKAGES[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${CLANG_PACKAGES[@]}"
fi

# -O2 with line tables for the reports; asserts stay on (no NDEBUG).
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DMOEKIT_CUDA=OFF -DMOEKIT_BUILD_BENCH=OFF \
  -DMOEKIT_SANITIZE=address,undefined -DMOEKIT_FUZZ=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
[[ "${1:-}" == "--build-only" ]] && exit 0

cd "$BUILD_DIR"
# allocator_may_return_null: the tests of buffers that cannot be allocated ask for
# more than ASan's allocator serves; they must see the failure moekit handles
# (a null aligned_alloc, std::bad_alloc), not an abort.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || true)}"
ctest --output-on-failure --label-regex '^unit$' -j "$JOBS"
echo "sanitize: every unit test passed under AddressSanitizer + UndefinedBehaviorSanitizer"
