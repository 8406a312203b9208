#!/usr/bin/env bash
# The wheel as a GPU user gets it, on a CUDA machine with no package registry:
# scripts/build_wheel.sh with the CUDA backend (build tools from .deps/wheels),
# then `pip install` of that wheel into a fresh virtual environment (torch from
# the system's site packages, the wheel's one requirement; nothing compiled),
# and, with no compiler on PATH: `moekit --version`, `moekit run` (it must pick
# the CUDA backend), a layer on the GPU against the same layer on the CPU, and
# the Python gpu tests from another folder. Prints the wheel's size and what it
# carries, and a summary last. Exit status 0 only when all of it passed.
#
#   scripts/gpu_wheel_check.sh        # work folder build-wheel-gpu/ (MOEKIT_WHEEL_BUILD); PYTHON (python3)
#   MOEKIT_CUDA=OFF scripts/gpu_wheel_check.sh   # the CPU wheel: the same steps up to the GPU ones
set -uo pipefail
cd "$(dirname "$0")/.."
readonly ROOT=$PWD
readonly WORK=${MOEKIT_WHEEL_BUILD:-$ROOT/build-wheel-gpu}
readonly PY=${PYTHON:-python3}
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
rm -rf "$WORK"
mkdir -p "$WORK"
declare -a SUMMARY=()
FAILED=0
step() {  # name, command...: runs it with its output in $WORK/<name>.log
  local name=$1; shift
  local t0; t0=$(date +%s)
  if "$@" > "$WORK/$name.log" 2>&1; then SUMMARY+=("ok    $name ($(( $(date +%s) - t0 )) s)")
  else SUMMARY+=("FAIL  $name (exit $?, $WORK/$name.log)"); FAILED=1; tail -n 15 "$WORK/$name.log"; fi
}

"$PY" -m venv --system-site-packages "$WORK/build-venv"
step build_wheel env MOEKIT_CUDA="${MOEKIT_CUDA:-ON}" MOEKIT_WHEEL_PYTHON="$WORK/build-venv/bin/python" \
  MOEKIT_WHEEL_FIND_LINKS="$ROOT/.deps/wheels" MOEKIT_WHEEL_BUILD="$WORK" scripts/build_wheel.sh "$WORK/dist"
wheel=$(ls "$WORK"/dist/moekit-*.whl 2>/dev/null | head -1)
if [[ -z $wheel ]]; then
  printf '%s\n' "${SUMMARY[@]}"; echo "RESULT   FAIL (no wheel)"; exit 1
fi

# A user's environment: a fresh venv, the wheel installed by pip, no nvcc on PATH.
"$PY" -m venv --system-site-packages "$WORK/user-venv"
# It sees the packages of $PY's environment too (torch, where $PY is a venv itself), not moekit.
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
  "$("$WORK/user-venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_env.pth"
step pip_install "$WORK/user-venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check "$wheel"
# The machine's PATH without CUDA's folders (no nvcc), the venv first; torch is wherever this
# machine keeps it (machine_env.pth above), as a user's own torch would be.
USER_PATH="$WORK/user-venv/bin:$(tr ':' '\n' <<<"$PATH" | grep -v cuda | paste -sd:)"
readonly USER_PATH
in_user_env() { (cd "$WORK" && env PATH="$USER_PATH" "$@"); }
# pip installs the wheel's files as they are: nothing is built (and nvcc is not on the user's PATH).
step nothing_built bash -c "! grep -iE 'building wheel|running setup|cmake' '$WORK/pip_install.log'"
step version in_user_env moekit --version
step moekit_run in_user_env moekit run
step run_on_gpu grep -E '^backend: +cuda' "$WORK/moekit_run.log"
step gpu_layer in_user_env python - <<'PY'
import os, torch, moekit
assert "user-venv" in moekit.__file__, moekit.__file__
print(moekit.__version__, moekit.platform())
torch.manual_seed(0)
E, k, H, I, M = 16, 4, 256, 128, 96
cfg = moekit.MoeConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I, routing="renormalize")
w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16) / H ** 0.5
w2 = torch.randn(E, H, I, dtype=torch.bfloat16) / I ** 0.5
x = torch.randn(M, H, dtype=torch.bfloat16)
logits = torch.randn(M, E)
gpu = moekit.MoeLayer(cfg, w13.cuda(), w2.cuda(), device="cuda")
cpu = moekit.MoeLayer(cfg, w13, w2, device="cpu")
print("gpu layer:", gpu)
y_gpu, ids_gpu = gpu(x.cuda(), logits.cuda(), return_ids=True)
y_cpu, ids_cpu = cpu(x, logits, return_ids=True)
assert torch.equal(ids_gpu.cpu(), ids_cpu), "expert ids differ between the GPU and the CPU"
err = (y_gpu.float().cpu() - y_cpu.float()).abs().max().item()
scale = y_cpu.float().abs().max().item()
print(f"max |gpu - cpu| = {err:.3e} (output max {scale:.3e})")
assert err <= 2e-2 * scale, "the GPU layer is off the CPU layer"  # two bf16 roundings of the intermediate
PY
# The gpu tests that need no optional package, against the installed wheel (from another folder).
pytest_path=$WORK/pytest
"$PY" -m pip install --no-index --find-links "$ROOT/.deps/wheels" --target "$pytest_path" pytest > "$WORK/pytest_install.log" 2>&1
step pytest_gpu in_user_env env PYTHONPATH="$pytest_path" python -m pytest -q -rs -p no:cacheprovider -m gpu \
  "$ROOT/python/tests/test_gpu.py" "$ROOT/python/tests/test_batch_invariant.py" \
  "$ROOT/python/tests/test_layer_options.py" "$ROOT/python/tests/test_replay_routing.py"

echo
echo "==== moekit gpu wheel check ===="
echo "wheel    $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
"$PY" -m zipfile -l "$wheel" | awk 'NR > 1 && $1 !~ /\/$/ {printf "         %-60s %10d\n", $1, $NF}' |
  grep -E '_moekit|_bin/|\.libs/|entry_points|METADATA|WHEEL'
"$PY" - "$wheel" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
wheel = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
print("\n".join("         " + l for l in z.read(wheel).decode().splitlines() if l.startswith("Tag:")))
PY
site=$("$WORK/user-venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
for f in "$site"/moekit/_moekit*.so "$site"/moekit/_bin/moekit; do  # what the loader must find on a user's machine
  [[ -f $f ]] && echo "needs    $(basename "$f"): $(readelf -d "$f" | grep NEEDED | grep -oE '\[.*\]' | tr -d '[]' | paste -sd' ')"
done
echo "version  $(cat "$WORK/version.log" 2>/dev/null)"
grep -E '^backend:|^device:|^replay:' "$WORK/moekit_run.log" | sed 's/^/run      /'
grep -E 'max \|gpu|gpu layer' "$WORK/gpu_layer.log" | sed 's/^/layer    /'
tail -n 1 "$WORK/pytest_gpu.log" | sed 's/^/pytest   /'
printf '%s\n' "${SUMMARY[@]}"
if ((FAILED)); then echo "RESULT   FAIL"; exit 1; fi
echo "RESULT   PASS"
