#!/usr/bin/env bash
# A/B of two source trees on one CUDA machine: the GPU benchmark built from this
# tree and from BASE (a folder or a .tar.gz of another revision, e.g.
# `git archive REV | gzip`), run alternately ROUNDS times on the same cases, so
# that the tree-to-tree difference can be read against each tree's own
# run-to-run spread. Prints, per case, the median CUDA-graph launch and the
# eager host cost (enqueue) of each tree, last.
#
#   scripts/ab_trees.sh BASE [RESULTS_DIR] [moekit_gpu_bench args...]
#
# Environment: BUILD_DIR (this tree's CUDA build, default build-gpu; built here
# if needed), BASE_BUILD_DIR (default build-ab/base), ROUNDS (default 2).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base="${1:?usage: scripts/ab_trees.sh BASE [RESULTS_DIR] [bench args...]}"
out="${2:-$root/bench/results/latest/ab_trees}"
shift $(( $# > 2 ? 2 : $# )) || true
build="${BUILD_DIR:-$root/build-gpu}"
base_build="${BASE_BUILD_DIR:-$root/build-ab/base}"
rounds="${ROUNDS:-2}"
mkdir -p "$out"

if [ -f "$base" ]; then
  src="$base_build/src"
  rm -rf "$src" && mkdir -p "$src" && tar -xzf "$base" -C "$src"
else
  src="$base"
fi
configure_and_build() {  # source dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON -DMOEKIT_DEPS_DIR="$root/.deps" \
    >"$2.configure.log" 2>&1 || { tail -n 20 "$2.configure.log"; return 1; }
  ninja -C "$2" -j"$(nproc)" moekit_gpu_bench_bin >"$2.build.log" 2>&1 || { grep -E ' error' "$2.build.log" | head; return 1; }
}
mkdir -p "$base_build"
t0=$(date +%s)
configure_and_build "$root" "$build"
configure_and_build "$src" "$base_build/build"
echo "[ab_trees] built both trees in $(( $(date +%s) - t0 ))s"

for r in $(seq 1 "$rounds"); do
  for side in base new; do
    bin="$build/bench/moekit_gpu_bench"
    [ "$side" = base ] && bin="$base_build/build/bench/moekit_gpu_bench"
    "$bin" --shapes "$root/bench/shapes/moe_layers.json" --no-capture-modes --json "$out/${side}_$r.json" "$@" \
      >"$out/${side}_$r.log" 2>&1 || { tail -n 5 "$out/${side}_$r.log"; exit 1; }
  done
done
python3 "$root/bench/ab_table.py" "$out" | tee "$out/table.txt"
