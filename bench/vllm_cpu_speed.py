#!/usr/bin/env python3
"""vLLM's tokens/s on the CPU with and without moekit.vllm (run in the vLLM venv, .venv-vllm).

The model: two decoder layers with Qwen3-30B-A3B's shapes (hidden 2048, 128 experts, top-8,
moe_intermediate 768, 32 query / 4 KV heads of 128), a 2048-token vocabulary, bf16, random
weights (transformers' init), written once into --folder. Each side (vLLM's own MoE path, then
the plugin) runs in a subprocess of its own (one engine per process, as vLLM's CPU build wants),
eager, prefix caching off, and times:
  decode_b1    1 prompt of 16 tokens: (time to 1 + D new tokens - time to 1) / D, D = 32
  decode_b32   32 prompts of 16 tokens, the same with D = 16: 32 * D / time
  prefill_2048 1 prompt of 2048 tokens, 1 new token: 2048 / time
best of --reps runs each. `moe_share` is the part of each case's time spent in the MoE
blocks (each decoder layer's mlp: router GEMM and experts, their forward timed; the CPU runs
them synchronously), the rest being attention, norms, the LM head and the sampler.

  .venv-vllm/bin/python bench/vllm_cpu_speed.py --out bench/results/cpu_v15/vllm_cpu_speed.json
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

SHAPE = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
             norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             intermediate_size=6144, vocab_size=2048, num_hidden_layers=2, max_position_embeddings=4096,
             bos_token_id=2, eos_token_id=1)
CASES = {"decode_b1": (1, 16, 32), "decode_b32": (32, 16, 16), "prefill_2048": (1, 2048, 0)}


def build(folder: str) -> None:
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**SHAPE)).eval()
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(SHAPE["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1",
                                         bos_token="t2").save_pretrained(folder)


def side(folder: str, plugin: bool, reps: int) -> dict:
    """One engine in this process; {case: {"tokens_per_s", "moe_share"}} and the plugin's report."""
    os.environ.update(VLLM_CPU_KVCACHE_SPACE="2", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                      MOEKIT_VLLM="1" if plugin else "0")
    from vllm import LLM, SamplingParams
    if plugin:
        import moekit.vllm
        moekit.vllm.register()
    llm = LLM(folder, dtype="bfloat16", enforce_eager=True, distributed_executor_backend="uni",
              max_model_len=2304, max_num_seqs=32, max_num_batched_tokens=2304, enable_prefix_caching=False,
              seed=0)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    moe_time = [0.0]
    for layer in model.model.layers:
        block = layer.mlp  # the MoE block: router GEMM, experts, reduce

        def timed(*a, _forward=block.forward, **kw):
            t = time.perf_counter()
            out = _forward(*a, **kw)
            moe_time[0] += time.perf_counter() - t
            return out
        block.forward = timed

    def run(batch: int, prompt: int, new: int) -> tuple:
        prompts = [{"prompt_token_ids": [3 + (b * 7 + i) % 2000 for i in range(prompt)]} for b in range(batch)]
        params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
        moe_time[0] = 0.0
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t, moe_time[0]

    run(1, 16, 4)  # warm-up
    results = {}
    for name, (batch, prompt, new) in CASES.items():
        best = None
        for _ in range(reps):
            if new:  # decode: the steps after the first token
                (t1, m1), (tn, mn) = run(batch, prompt, 1), run(batch, prompt, 1 + new)
                t, m, tokens = tn - t1, mn - m1, batch * new
            else:
                (t, m), tokens = run(batch, prompt, 1), batch * prompt
            if best is None or t < best[0]:
                best = (t, m, tokens)
        t, m, tokens = best
        results[name] = {"tokens_per_s": tokens / t, "seconds": t, "moe_share": m / t}
    if plugin:
        results["report"] = moekit.vllm.report()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default="/tmp/moekit-vllm-bench-qwen3-30b-a3b-2l")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--side", choices=["vllm", "moekit"], help=argparse.SUPPRESS)  # one side, in a subprocess
    args = ap.parse_args()
    if args.side:
        print("RESULT " + json.dumps(side(args.folder, args.side == "moekit", args.reps)))
        return
    build(args.folder)
    sides = {}
    for name in ("vllm", "moekit"):
        out = subprocess.run([sys.executable, __file__, "--folder", args.folder, "--reps", str(args.reps),
                              "--side", name], capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            sys.exit(f"{name} side failed ({out.returncode}):\n{out.stderr[-4000:]}")
        sides[name] = json.loads(lines[-1][len("RESULT "):])
    print(f"{'case':<14}{'vLLM tok/s':>12}{'moekit tok/s':>14}{'moekit/vLLM':>13}{'MoE share vLLM':>16}"
          f"{'MoE share moekit':>18}")
    for case in CASES:
        v, m = sides["vllm"][case], sides["moekit"][case]
        print(f"{case:<14}{v['tokens_per_s']:>12.1f}{m['tokens_per_s']:>14.1f}"
              f"{m['tokens_per_s'] / v['tokens_per_s']:>13.2f}{v['moe_share']:>16.0%}{m['moe_share']:>18.0%}")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        import vllm
        with open(args.out, "w") as f:
            json.dump({"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                       "vllm": vllm.__version__, "shape": SHAPE, "cases": CASES, "sides": sides}, f, indent=1)


if __name__ == "__main__":
    main()
