#!/usr/bin/env bash
# Checks the user's path, `pip install .`, against what a user installs today:
# a virtual environment of its own ($MOEKIT_NEWEST_VENV, default .venv-newest)
# with the newest numpy, torch, transformers, pytest and hypothesis on PyPI
# (the binding stack, nanobind and scikit-build-core, pinned as in
# pyproject.toml), on the newest Python 3.12+ found (numpy 2.5 needs 3.12),
# else python3. The wheel is built by scripts/build_wheel.sh (CPU backend only,
# so CI does not compile the CUDA sources a second time; auditwheel bundles
# OpenBLAS), installed into a folder of its own, its `moekit` command run, the
# README's install block run as written in a fresh virtual environment, and
# the pytest suite runs against it from another folder so the wheel is what
# imports. The pinned versions are tested in .venv by
# scripts/test.sh.
#
#   scripts/check_wheel.sh            # work folder build-wheel/
set -euo pipefail
cd "$(dirname "$0")/.."
readonly ROOT=$PWD
readonly VENV="${MOEKIT_NEWEST_VENV:-.venv-newest}"
readonly WORK="${MOEKIT_WHEEL_DIR:-build-wheel}"

python=""
for candidate in python3.14 python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    python=$(command -v "$candidate")
  fi
done
python=${python:-python3}
if [[ ! -x $VENV/bin/python ]]; then
  "$python" -m venv "$VENV"
fi
PY=$(cd "$VENV" && pwd)/bin/python
readonly PY
binding=$(grep -E '^(nanobind|scikit-build-core)==' python/requirements.txt)
echo "check_wheel: newest numpy/torch/transformers/pytest/hypothesis on $("$PY" --version) in $VENV/" \
     "($(df -h --output=avail . | tail -1 | tr -d ' ') free on disk)"
# No pip cache: torch's CUDA wheels would take their gigabytes twice.
# shellcheck disable=SC2086  # $binding: one pinned requirement per word
"$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir --upgrade numpy torch transformers pytest hypothesis $binding
"$PY" - <<'PY'
import numpy, torch, transformers
print(f"check_wheel: numpy {numpy.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY

rm -rf "$WORK/site" "$WORK/dist"
mkdir -p "$WORK"
echo "check_wheel: scripts/build_wheel.sh (CPU backend), then the wheel installed into $WORK/site"
MOEKIT_CUDA=OFF MOEKIT_WHEEL_PYTHON="$PY" MOEKIT_WHEEL_BUILD="$WORK" scripts/build_wheel.sh "$WORK/dist"
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$WORK/site" "$WORK"/dist/moekit-*.whl
cd "$WORK"
SITE=$(pwd)/site
PYTHONPATH="$SITE" "$PY" - <<'PY'
import moekit, os
where = os.path.dirname(moekit.__file__)
assert where.endswith(os.path.join("site", "moekit")), f"imported moekit from {where}, not the wheel"
print(f"check_wheel: moekit from {where}; {moekit.platform()}")
# The entry point vLLM loads in every process it starts (docs/vllm.md).
from importlib.metadata import entry_points
plugin = [e for e in entry_points(group="vllm.general_plugins") if e.name == "moekit"]
assert plugin and plugin[0].value == "moekit.vllm:register", f"vllm.general_plugins: {plugin}"
import moekit.vllm
assert plugin[0].load() is moekit.vllm.register
print("check_wheel: vllm.general_plugins entry point moekit = moekit.vllm:register")
PY
# The console script runs the binary the wheel carries: --version, then the main job on a small model.
version=$(PYTHONPATH="$SITE" "$PY" -c 'import moekit; print(moekit.__version__)')
test "$(PYTHONPATH="$SITE" "$SITE/bin/moekit" --version)" = "moekit $version"
# The README's install block, as written, in a fresh virtual environment that
# sees the newest one's packages (torch, the wheel's one requirement, is not
# downloaded again) but has no moekit: pip installs the wheel, then its command runs.
rm -rf venv-readme
"$PY" -m venv venv-readme
newest_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
readme_site=$(venv-readme/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$newest_site" > "$readme_site/newest_venv.pth"
readme_block=$("$PY" "$ROOT/python/tests/doc_blocks.py" readme-install)
PATH="$PWD/venv-readme/bin:$PATH" bash -euo pipefail -c "$readme_block" > readme_install.log 2>&1 ||
  { tail -n 20 readme_install.log; echo "check_wheel: the README's install block failed"; exit 1; }
grep -E '^moekit [0-9]|^replay:' readme_install.log
test "$(venv-readme/bin/moekit --version)" = "moekit $version"
echo "check_wheel: the README's install block ran as written (pip install of the wheel, moekit --version, moekit run)"
PYTHONPATH="$SITE" "$PY" -m pytest "$ROOT/python/tests" -q -rs -p no:cacheprovider
