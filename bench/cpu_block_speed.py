#!/usr/bin/env python3
"""One Qwen2-MoE sparse-MoE block (H 1024, 60 experts, top-4, I 704, shared expert 2816, random
weights) on the CPU: transformers' own forward against the block moekit.transformers.patch puts in
its place, f32 and bf16, M tokens per call; median of --reps calls after a warm-up, no grad.

  .venv/bin/python bench/cpu_block_speed.py --out bench/results/cpu_v16/cpu_block_speed.json
"""
import argparse
import json
import platform
import time

import torch
import transformers

import moekit.transformers as mt


def median_ms(f, reps: int) -> float:
    with torch.no_grad():
        for _ in range(20):
            f()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2] * 1e3


def block_times(dtype: torch.dtype, tokens, reps: int) -> dict:
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(hidden_size=1024, num_experts=60, num_experts_per_tok=4,
                                      moe_intermediate_size=704, shared_expert_intermediate_size=2816,
                                      intermediate_size=2816, num_hidden_layers=1, num_attention_heads=16,
                                      num_key_value_heads=4, vocab_size=2048, max_position_embeddings=512)
    model = transformers.Qwen2MoeForCausalLM(cfg).eval().to(dtype)
    x = {m: torch.randn(1, m, cfg.hidden_size, dtype=dtype) for m in tokens}
    block = model.model.layers[0].mlp
    plain = {m: median_ms(lambda: block(x[m]), reps) for m in tokens}
    mt.patch(model, strict=True)
    block = model.model.layers[0].mlp
    patched = {m: median_ms(lambda: block(x[m]), reps) for m in tokens}
    return {str(m): {"transformers_ms": plain[m], "moekit_ms": patched[m], "speedup": plain[m] / patched[m]}
            for m in tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 64])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", help="JSON results file")
    args = ap.parse_args()
    result = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(),
              "f32": block_times(torch.float32, args.tokens, args.reps),
              "bf16": block_times(torch.bfloat16, args.tokens, args.reps)}
    print(f"{'dtype':6} {'M':>5} {'transformers ms':>16} {'moekit ms':>10} {'speedup':>8}")
    for dtype in ("f32", "bf16"):
        for m, r in result[dtype].items():
            print(f"{dtype:6} {m:>5} {r['transformers_ms']:16.3f} {r['moekit_ms']:10.3f} {r['speedup']:8.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
