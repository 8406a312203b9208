#!/usr/bin/env python3
"""moekit's CPU work inside a torch process: its own thread pool against torch's OpenMP threads.

Each side runs in a subprocess of its own (MOEKIT_THREAD_POOL=own | torch, the pool chosen at
import; and own with OMP_WAIT_POLICY=PASSIVE), on every core torch uses, and times:
  layer_after_torch_op   a bf16 softmax top-k layer (--layer E,k,H,I,M; default 16 experts, top-4,
                         H 512, I 256, M = 4), its router logits computed by F.linear right
                         before the call (a torch op, so torch's workers have just run): median
  layer_logits_given     the same call with the logits computed once, before the timing
  decode                 greedy generate() of a 2-layer Qwen2-MoE model (H 1024, 60 experts,
                         top-4, I 704, shared expert 2816, f32, random weights), batch 1, a
                         16-token prompt: tokens/s over 32 new tokens (time to 33 - time to 1),
                         unpatched transformers and moekit.transformers.patch'ed, best of --reps
The same bits on both sides is a test (python/tests/test_layer.py); this is the speed.

  .venv/bin/python bench/cpu_thread_pool.py --out bench/results/cpu_v15/cpu_thread_pool.json
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def layer_times(shape, reps: int) -> dict:
    import torch
    import torch.nn.functional as F
    import moekit
    E, K, H, I, M = shape
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).bfloat16()
    router = (torch.randn(E, H, generator=g) / H ** 0.5).bfloat16()
    x = torch.randn(M, H, generator=g).bfloat16()
    layer = moekit.MoeLayer(moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                                             max_num_tokens=M, routing="softmax_topk"), w13, w2, device="cpu")
    logits = F.linear(x, router)
    out = {}
    for name, fresh_logits in (("layer_after_torch_op", True), ("layer_logits_given", False)):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            layer(x, F.linear(x, router) if fresh_logits else logits)
            times.append(time.perf_counter() - t0)
        out[name] = {"median_ms": 1e3 * statistics.median(times)}
    return out


def decode_tokens_per_s(reps: int) -> dict:
    import torch
    import transformers
    import moekit.transformers as mt
    torch.manual_seed(0)
    cfg = transformers.Qwen2MoeConfig(hidden_size=1024, num_experts=60, num_experts_per_tok=4,
                                      moe_intermediate_size=704, shared_expert_intermediate_size=2816,
                                      intermediate_size=2816, num_hidden_layers=2, num_attention_heads=16,
                                      num_key_value_heads=4, vocab_size=2048, max_position_embeddings=512)
    model = transformers.Qwen2MoeForCausalLM(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))

    def gen_time(n: int) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t0

    out = {}
    for name in ("unpatched", "patched"):
        if name == "patched":
            mt.patch(model, strict=True)
        gen_time(2)  # warm up
        best = min(gen_time(33) - gen_time(1) for _ in range(reps))
        out[name] = {"tokens_per_s": 32 / best}
    out["patched_over_unpatched"] = out["patched"]["tokens_per_s"] / out["unpatched"]["tokens_per_s"]
    return out


def side(shape, reps: int) -> dict:
    import torch
    import moekit
    from moekit import _moekit
    res = {"threads": moekit.get_num_threads(), "torch_threads": torch.get_num_threads(),
           "openmp_runtime": _moekit.openmp_runtime()}
    res.update(layer_times(shape, 20 * reps))
    res["decode"] = decode_tokens_per_s(reps)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="cpu_thread_pool.json")
    ap.add_argument("--layer", default="16,4,512,256,4",
                    help="E,k,H,I,M of the layer cases (default: a small layer, where a stall shows; "
                         "60,4,2048,1408,4 is Qwen1.5-MoE-A2.7B's, bound by memory bandwidth)")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = [int(v) for v in args.layer.split(",")]
    if args.side:
        print(json.dumps(side(shape, args.reps)))
        return
    sides = {}
    # The third side: moekit's own pool with every OpenMP thread waiting passively (torch's too).
    for name, env in (("own", dict(MOEKIT_THREAD_POOL="own")), ("torch", dict(MOEKIT_THREAD_POOL="torch")),
                      ("own_passive", dict(MOEKIT_THREAD_POOL="own", OMP_WAIT_POLICY="PASSIVE"))):
        run = subprocess.run([sys.executable, __file__, "--side", "--layer", args.layer, "--reps", str(args.reps)],
                             env=dict(os.environ, **env), capture_output=True, text=True, check=True)
        sides[name] = json.loads(run.stdout.strip().splitlines()[-1])
        print(name, json.dumps(sides[name]))
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
              "layer": dict(zip(("num_experts", "top_k", "hidden", "intermediate", "tokens"), shape)),
              "sides": sides}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'':28}" + "".join(f"{n:>14}" for n in sides))
    for case in ("layer_after_torch_op", "layer_logits_given"):
        print(f"{case + ' ms':28}" + "".join(f"{sides[n][case]['median_ms']:14.3f}" for n in sides))
    for key in ("unpatched", "patched"):
        print(f"{'decode ' + key + ' tok/s':28}" + "".join(f"{sides[n]['decode'][key]['tokens_per_s']:14.1f}"
                                                           for n in sides))


if __name__ == "__main__":
    main()
