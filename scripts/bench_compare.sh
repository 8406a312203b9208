#!/usr/bin/env bash
# Runs the GPU MoE benchmark and its PyTorch peer in one go on a CUDA machine,
# checks the peer's outputs against moekit's, and prints the moekit/PyTorch
# table last.
#
#   scripts/bench_compare.sh [BUILD_DIR] [RESULTS_DIR] [extra moekit_gpu_bench args...]
#
# BUILD_DIR (default build) must hold a CUDA build with bench/moekit_gpu_bench.
# RESULTS_DIR (default bench/results/latest) receives moekit.json, peer.json and
# the two logs; the dumped outputs go to a temporary folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-build}"
results="${2:-$root/bench/results/latest}"
shift $(( $# > 2 ? 2 : $# )) || true
bench="$build/bench/moekit_gpu_bench"
[ -x "$bench" ] || { echo "bench_compare: $bench not built (configure with CUDA, build moekit_gpu_bench_bin)" >&2; exit 2; }
mkdir -p "$results"
dumps="$(mktemp -d)"
trap 'rm -rf "$dumps"' EXIT

rc=0
"$bench" --shapes "$root/bench/shapes/moe_layers.json" --json "$results/moekit.json" --dump-dir "$dumps" "$@" \
  2>&1 | tee "$results/moekit.log" || rc=$?
[ -f "$results/moekit.json" ] || { echo "bench_compare: the moekit run wrote no results" >&2; exit 1; }
# The peer runs the cases the moekit run finished, even if some failed.
PYTHONUNBUFFERED=1 python3 "$root/bench/peer_torch.py" --moekit-json "$results/moekit.json" --dump-dir "$dumps" \
  --json "$results/peer.json" 2>&1 | tee "$results/peer.log" || rc=$?
exit "$rc"
