#!/usr/bin/env bash
# The C++ package as a user gets it: `cmake --install` of the build into a
# prefix, then examples/cpp built against it through find_package(moekit) alone
# (no path into this tree), and run on a tiny Qwen3-MoE folder that transformers
# saves (random bf16 weights): layer 1 alone, then every layer as a Model with
# requests captured to a file; each must replay its capture bit for bit.
#
#   scripts/check_cpp_package.sh            # after scripts/setup.sh (build/, .venv/)
set -euo pipefail
cd "$(dirname "$0")/.."
readonly BUILD_DIR="${MOEKIT_BUILD_DIR:-build}"
readonly VENV="${MOEKIT_VENV:-.venv}"
readonly WORK="$BUILD_DIR/cpp_package"

rm -rf "$WORK"
cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" >/dev/null
cmake -S examples/cpp -B "$WORK/example" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$WORK/prefix" >/dev/null
cmake --build "$WORK/example"
"$VENV/bin/python" - "$WORK/model" <<'PY'
import sys, torch, transformers
torch.manual_seed(0)
cfg = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                  num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64)
transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
PY
"$WORK/example/layer_capture_replay" "$WORK/model" 1 16 | tee "$WORK/run.txt"
grep -q "bit for bit" "$WORK/run.txt"
"$WORK/example/capture_requests" "$WORK/model" "$WORK/capture.safetensors" | tee "$WORK/capture.txt"
grep -q "bit for bit" "$WORK/capture.txt"
echo "check_cpp_package: find_package(moekit) built examples/cpp, and both programs' replays matched bit for bit"
