#!/usr/bin/env bash
# Checks the user's path, `pip install .`: builds the wheel with scikit-build-core
# (CPU backend only, so CI does not compile the CUDA sources a second time),
# installs it into a folder of its own and runs the pytest suite against it
# with .venv's Python (torch), from another folder so the wheel is what imports.
#
#   scripts/check_wheel.sh            # after scripts/setup.sh; work folder build-wheel/
set -euo pipefail
cd "$(dirname "$0")/.."
readonly ROOT=$PWD
readonly VENV="${MOEKIT_VENV:-.venv}"
readonly WORK="${MOEKIT_WHEEL_DIR:-build-wheel}"
readonly PY=$ROOT/$VENV/bin/python

rm -rf "$WORK/site"
mkdir -p "$WORK"
echo "check_wheel: pip install . (CPU backend) into $WORK/site"
# --no-build-isolation: the pinned nanobind and scikit-build-core of .venv build it.
"$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps --target "$WORK/site" . \
  -C build-dir="$WORK/build" -C cmake.define.MOEKIT_CUDA=OFF
cd "$WORK"
PYTHONPATH="$ROOT/$WORK/site" "$PY" - <<'PY'
import moekit, os
where = os.path.dirname(moekit.__file__)
assert where.endswith(os.path.join("site", "moekit")), f"imported moekit from {where}, not the wheel"
print(f"check_wheel: moekit from {where}; {moekit.platform()}")
PY
PYTHONPATH="$ROOT/$WORK/site" "$PY" -m pytest "$ROOT/python/tests" -q -p no:cacheprovider
