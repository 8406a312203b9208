#!/usr/bin/env bash
# Sets up and builds moekit (scripts/setup.sh), then runs the tests: the `unit`
# label (CPU) and the `gpu` label (each gpu test skips itself, reported as
# skipped, when no CUDA device is present). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

"./scripts/setup.sh"
readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly JOBS="${MOEKIT_JOBS:-$(nproc)}"
cd "$BUILD_DIR"
ctest --output-on-failure --label-regex '^(unit|gpu)$' -j "$JOBS"
