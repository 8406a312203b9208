#!/usr/bin/env python3
"""transformers model speed with and without moekit.transformers.patch.

Two model shapes (qwen3_30b_a3b, mixtral_8x7b), each a transformers model with 2
decoder layers, random weights (experts ~ randn/sqrt(fan_in)), bf16. Each model is
built once and timed unpatched and patched in the same process, alternating
(unpatched, patched, unpatched, patched, ... one pair a round), median over --reps
calls a round:
  decode   one new token per sequence against a KV cache holding a 128-token prompt,
           eager, B in {1, 32}: tokens/s = B / step time
  compile  the same step through torch.compile(model) (default mode; fullgraph=True,
           else the default with the graph breaks recorded)
  prefill  one forward of 4096 tokens, batch 1, eager: tokens/s
  graphs   (--graphs) model.generate(cache_implementation="static") with the forward
           compiled in mode="reduce-overhead" (CUDA graphs), 32 new tokens
  eager_experts  decode (B in {1, 32}) and prefill again, the unpatched side with
           transformers' "eager" experts implementation (one expert at a time, the
           block as its modeling file writes it) instead of its default (grouped_mm)
  train    one training step (forward with labels, backward) of 4 x 1024 tokens,
           live routing, eager; tokens/s and the peak memory of each side
speedup = unpatched time / patched time, against the targets for qwen3_30b_a3b
(mixtral: reported only; the targets are read against the default experts).
--patch-time instead times moekit.transformers.patch on a CPU bf16 model of each
shape, beside the weight bytes it copies and a plain copy of the same bytes.

On the GPU (moekit's python package on PYTHONPATH):
  python bench/transformers_speed.py --graphs --out bench/results/<dir>/transformers_speed.json
  python bench/transformers_speed.py --patch-time --out bench/results/<dir>/transformers_patch_time.json
A quick test on the CPU: --device cpu --small --rounds 2 --reps 3.
"""
import argparse
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import transformers

import moekit
import moekit.transformers as mt

SHAPES = {
    "qwen3_30b_a3b": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144, vocab_size=2048,
        num_hidden_layers=2, max_position_embeddings=8192, decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral_8x7b": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=2048, num_hidden_layers=2,
        max_position_embeddings=8192)),
}
# --small: every shape shrunk so the whole script runs on a CPU.
SMALL = {
    "qwen3_30b_a3b": dict(hidden_size=256, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512),
    "mixtral_8x7b": dict(hidden_size=256, intermediate_size=128, num_local_experts=16, num_experts_per_tok=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
TARGETS = {"qwen3_30b_a3b": {"decode": 3.0, "compile": 1.5, "prefill": 2.0}}  # speedups (the issue's)
PATCH_TARGET_S = 2.0  # patch under 2 s plus the weight copy
PROMPT = 128
NEW_TOKENS = 32
BATCHES = (1, 32)


def build(shape: str, small: bool, device: torch.device):
    cfg_name, model_name, fields = SHAPES[shape]
    fields = dict(fields, **(SMALL[shape] if small else {}))
    config = getattr(transformers, cfg_name)(**fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, model_name)._from_config(config, dtype=torch.bfloat16)
    model.eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for p in layer.mlp.experts.parameters():  # gate_up_proj [E, 2I, H], down_proj [E, H, I]
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return model


def use(model, moes: dict, patched: bool) -> None:
    """Puts the patched layers (built once by patch) in, or transformers' blocks back, as
    patch/unpatch do, without preparing moekit's weights again each round."""
    for i, moe in moes.items():
        model.model.layers[i].mlp = moe if patched else moe.block


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, reps: int, device, prep=None) -> float:
    """Median seconds of one call over reps calls (CUDA events on the GPU); prep() runs
    before each call, outside the timed span."""
    prep = prep or (lambda: None)
    times = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            prep()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) / 1e3 for start, end in events]
    else:
        for _ in range(reps):
            prep()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ab(model, moes, fns: dict, args, device, warmup: int = 3, prep=None) -> dict:
    """fns: {"unpatched": f, "patched": f}. Warm-up, then rounds of one median each, alternating."""
    for name in ("unpatched", "patched"):
        use(model, moes, name == "patched")
        for _ in range(warmup):
            if prep:
                prep()
            fns[name]()
        sync(device)
    medians = {"unpatched": [], "patched": []}
    for _ in range(args.rounds):
        for name in ("unpatched", "patched"):
            use(model, moes, name == "patched")
            medians[name].append(time_calls(fns[name], args.reps, device, prep))
    use(model, moes, False)
    return medians


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def compare(model, moes, fns, prep=None) -> dict:
    """Patched vs unpatched output of one call: relative L2 and argmax agreement (bf16
    rounding gives ~1e-2; a row whose router sits on a near-tie may pick another expert
    in a later layer and then differs O(1), which argmax_agree shows)."""
    out = {}
    for name in ("unpatched", "patched"):
        use(model, moes, name == "patched")
        if prep:
            prep()
        out[name] = fns[name]().detach().float().clone()
    use(model, moes, False)
    a, b = out["patched"], out["unpatched"]
    return {"rel_l2": rel_l2(a, b), "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def decode_step(model, B: int, device):
    """(kwargs, prep) of one decode step. A StaticCache of PROMPT + 1 slots is filled by
    one PROMPT-token prefill; each step writes its token's K/V into slot PROMPT and
    attends over the prompt and itself. prep() (untimed, before every step) sets the
    cache's length back to PROMPT in place, so every step sees the same context and
    overwrites the same slot: nothing is copied between steps."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(B)
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + 1)
    prompt = torch.randint(0, vocab, (B, PROMPT), generator=g).to(device)
    model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    kwargs = dict(input_ids=torch.randint(0, vocab, (B, 1), generator=g).to(device), past_key_values=cache,
                  use_cache=True, position_ids=torch.full((B, 1), PROMPT, device=device))
    if "cache_position" in inspect.signature(model.model.forward).parameters:  # transformers before 5.2x
        kwargs["cache_position"] = torch.tensor([PROMPT], device=device)

    def prep():
        for layer in cache.layers:
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(PROMPT)

    return kwargs, prep


def case_result(shape, case, B, tokens, medians, check, extra=None) -> dict:
    u, p = statistics.median(medians["unpatched"]), statistics.median(medians["patched"])
    target = TARGETS.get(shape, {}).get(case)
    r = {"case": case, "batch": B, "tokens_per_call": tokens,
         "unpatched": {"round_medians_s": medians["unpatched"], "median_s": u, "tokens_per_s": tokens / u},
         "patched": {"round_medians_s": medians["patched"], "median_s": p, "tokens_per_s": tokens / p},
         "speedup": u / p, "target": target, "met": None if target is None else u / p >= target, "check": check}
    r.update(extra or {})
    name = f"{case} B={B}" if not case.startswith("prefill") else f"{case} {tokens}"
    print(f"  {name:26s} unpatched {tokens / u:11.1f} tok/s  patched {tokens / p:11.1f} tok/s  "
          f"speedup {u / p:5.2f}x" + (f" (target {target}x: {'met' if u / p >= target else 'NOT met'})"
                                      if target else "")
          + (f"  logits rel_l2 {check['rel_l2']:.2e}, argmax agree {check['argmax_agree']:.3f}" if "rel_l2" in check
             else ""))
    return r


def brief(msg: str) -> str:
    """An exception text's first line and its 'Caused by' line (dynamo's), for printing."""
    lines = [l.strip() for l in str(msg).splitlines() if l.strip()]
    caused = [l for l in lines if l.startswith("Caused by")]
    return " | ".join((lines[:1] + caused[:1]))[:400]


def explain(model, kwargs) -> dict:
    torch._dynamo.reset()
    try:
        e = torch._dynamo.explain(model)(**kwargs)
        return {"graph_count": e.graph_count, "graph_break_count": e.graph_break_count,
                "break_reasons": [str(b.reason) for b in e.break_reasons][:10]}
    except Exception as exc:  # noqa: BLE001 - recorded, not hidden
        return {"explain_failed": f"{type(exc).__name__}: {exc}"[:2000]}


def compiled_fns(model, moes, kwargs, prep, device) -> dict:
    """{"unpatched"/"patched": compiled step or None, "notes": ...}: fullgraph=True first,
    else the default (graph breaks recorded), else the failure."""
    fns, notes = {}, {}
    torch._dynamo.reset()
    for name in ("unpatched", "patched"):
        use(model, moes, name == "patched")
        note = {}
        for fullgraph in (True, False):
            f = torch.compile(model, fullgraph=fullgraph)
            try:
                for _ in range(3):
                    prep()
                    f(**kwargs)
                sync(device)
            except Exception as exc:  # noqa: BLE001 - recorded, not hidden
                note[f"fullgraph_{fullgraph}_error"] = f"{type(exc).__name__}: {exc}"[:2000]
                print(f"  compile {name} fullgraph={fullgraph} failed: {type(exc).__name__}: {brief(exc)}")
                if fullgraph:
                    use(model, moes, name == "patched")
                    prep()
                    note["explain"] = explain(model, kwargs)
                    e = note["explain"]
                    print(f"  explain {name}: " + (e["explain_failed"][:400] if "explain_failed" in e else
                          f"{e['graph_count']} graphs, {e['graph_break_count']} breaks; first: "
                          f"{brief(e['break_reasons'][0]) if e['break_reasons'] else '-'}"))
                continue
            note["fullgraph"] = fullgraph
            fns[name] = f
            break
        notes[name] = note
    use(model, moes, False)
    return fns, notes


def run_shape(shape: str, args, device, cases) -> dict:
    print(f"\n== {shape}{' (small)' if args.small else ''}")
    model = build(shape, args.small, device)
    out = {"config": {k: v for k, v in model.config.to_dict().items() if not isinstance(v, dict)},
           "experts_implementation": getattr(model.config, "_experts_implementation", None),
           "attn_implementation": getattr(model.config, "_attn_implementation", None), "cases": []}
    report = mt.patch(model)
    out["report"] = report
    for p in report["patched"]:
        print(f"  patched: layer {p['layer']} {p['block']} -> moekit {p['backend']}/{p['kernel']}")
    for p in report["left"]:
        print(f"  LEFT:    layer {p['layer']} {p['block']}: {p['reason']}")
    moes = {p["layer"]: model.model.layers[p["layer"]].mlp for p in report["patched"]}
    mt.unpatch(model)
    out["valid"] = not report["left"] and bool(moes)
    if not out["valid"]:
        print("  INVALID: a MoE layer was left to transformers; nothing timed")
        return out
    print(f"  transformers experts implementation (unpatched): {out['experts_implementation']}, "
          f"attention: {out['attn_implementation']}")

    with torch.no_grad():
        for B in BATCHES if "decode" in cases else ():
            out["cases"].append(decode_case(shape, "decode", model, moes, B, args, device))

        for B in BATCHES if "compile" in cases else ():
            kwargs, prep = decode_step(model, B, device)
            cfns, notes = compiled_fns(model, moes, kwargs, prep, device)
            if len(cfns) < 2:
                print(f"  compile B={B}: FAILED ({', '.join(n for n in ('unpatched', 'patched') if n not in cfns)})")
                out["cases"].append({"case": "compile", "batch": B, "failed": True, "compile": notes,
                                     "target": TARGETS.get(shape, {}).get("compile"), "met": False})
                continue
            fns = {n: (lambda f=cfns[n]: f(**kwargs).logits) for n in cfns}
            check = compare(model, moes, fns, prep)
            for n in cfns:  # compiled vs eager, each variant
                use(model, moes, n == "patched")
                prep()
                eager = model(**kwargs).logits.float().clone()
                prep()
                check[f"{n}_compiled_vs_eager_rel_l2"] = rel_l2(fns[n](), eager)
            use(model, moes, False)
            out["cases"].append(case_result(shape, "compile", B, B, ab(model, moes, fns, args, device, prep=prep),
                                            check, {"compile": notes}))
            torch._dynamo.reset()

        if "prefill" in cases:
            out["cases"].append(prefill_case(shape, "prefill", model, moes, args, device))

        if "eager_experts" in cases:
            # The same decode and prefill calls, the unpatched blocks on transformers' eager experts.
            default = model.get_experts_implementation()
            out["eager_experts_baseline_of"] = default
            model.set_experts_implementation("eager")
            try:
                for B in BATCHES:
                    out["cases"].append(decode_case(shape, "decode_eager_experts", model, moes, B, args, device))
                out["cases"].append(prefill_case(shape, "prefill_eager_experts", model, moes, args, device))
            finally:
                model.set_experts_implementation(default)

        for B in BATCHES if "graphs" in cases else ():
            try:
                out["cases"].append(graphs_case(shape, model, moes, B, args, device))
            except Exception as exc:  # noqa: BLE001 - printed, recorded, and the run goes on
                use(model, moes, False)
                msg = f"{type(exc).__name__}: {exc}"[:2000]
                print(f"  graphs B={B}: FAILED: {msg[:500]}")
                out["cases"].append({"case": "graphs", "batch": B, "failed": True, "error": msg})
            torch._dynamo.reset()
    if "train" in cases:
        out["cases"].append(train_case(shape, model, moes, args, device))
    del model, moes
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def decode_case(shape, case, model, moes, B, args, device) -> dict:
    """One eager decode step of B sequences (decode_step), patched against unpatched."""
    kwargs, prep = decode_step(model, B, device)
    fns = {n: (lambda: model(**kwargs).logits) for n in ("unpatched", "patched")}
    check = compare(model, moes, fns, prep)
    return case_result(shape, case, B, B, ab(model, moes, fns, args, device, prep=prep), check)


def prefill_case(shape, case, model, moes, args, device) -> dict:
    """One forward of S tokens, batch 1, no cache (use_cache=False), last position's logits."""
    S = 256 if args.small else 4096
    ids = torch.randint(0, model.config.vocab_size, (1, S), generator=torch.Generator().manual_seed(7)).to(device)
    fns = {n: (lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1).logits)
           for n in ("unpatched", "patched")}
    check = compare(model, moes, fns)
    return case_result(shape, case, 1, S, ab(model, moes, fns, args, device), check)


def train_case(shape, model, moes, args, device) -> dict:
    """One training step: forward with labels and backward, live routing, eager, bf16 weights.
    Patched: moekit's forward value, the blocks' own modules re-run in the backward
    (docs/transformers.md); unpatched: transformers' forward and backward. Also the peak
    memory of a step on each side, and the two losses and router gradients compared."""
    B, S = (2, 128) if args.small else (4, 1024)
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(11)).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def prep():
        for p in params:
            p.grad = None

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    fns = {"unpatched": step, "patched": step}
    check, peaks = {}, {}
    for name in ("unpatched", "patched"):
        use(model, moes, name == "patched")
        prep()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        loss = step()
        if device.type == "cuda":
            peaks[name] = torch.cuda.max_memory_allocated(device)
        check[name + "_loss"] = float(loss.detach())
        check[name + "_router_grads"] = [p.grad.detach().float().clone() for n, p in model.named_parameters()
                                         if n.endswith(".gate.weight") and ".layers." in n]
    router = [rel_l2(a, b) for a, b in zip(check.pop("patched_router_grads"), check.pop("unpatched_router_grads"))]
    check.update({"router_grad_rel_l2": router, "peak_bytes": peaks})
    result = case_result(shape, "train", B, B * S, ab(model, moes, fns, args, device, warmup=2, prep=prep), check)
    model.eval()
    prep()
    print(f"  train: loss unpatched {check['unpatched_loss']:.6f} patched {check['patched_loss']:.6f}, router grads "
          f"rel_l2 {', '.join(f'{r:.2e}' for r in router)}"
          + (f", peak GiB unpatched {peaks['unpatched'] / 2**30:.2f} patched {peaks['patched'] / 2**30:.2f}"
             if peaks else ""))
    return result


def graphs_case(shape, model, moes, B, args, device) -> dict:
    """Greedy generate with a static cache; on CUDA transformers compiles the decode
    forward (CompileConfig mode="reduce-overhead": CUDA graphs). One call: the prefill
    of PROMPT tokens and NEW_TOKENS steps; tokens/s = B * NEW_TOKENS / call time."""
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (B, PROMPT), generator=torch.Generator().manual_seed(100 + B)).to(device)
    gen = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
               do_sample=False, pad_token_id=0, eos_token_id=None, cache_implementation="static",
               compile_config=transformers.CompileConfig(mode="reduce-overhead"))
    torch._dynamo.reset()
    fns = {n: (lambda: model.generate(prompt, **gen)) for n in ("unpatched", "patched")}
    seqs = {}
    for name in ("unpatched", "patched"):
        use(model, moes, name == "patched")
        seqs[name] = fns[name]()[:, PROMPT:].clone()
        seqs[name + "_eager"] = model.generate(prompt, disable_compile=True, **gen)[:, PROMPT:].clone()
    use(model, moes, False)
    # Random weights give near-flat logits: one bf16 rounding may flip a greedy pick, and
    # the sequences part from there on; the first new token is the one compared exactly.
    check = {"tokens_agree_patched_unpatched": float((seqs["patched"] == seqs["unpatched"]).float().mean()),
             "first_token_agree_patched_unpatched":
                 float((seqs["patched"][:, 0] == seqs["unpatched"][:, 0]).float().mean()),
             "tokens_agree_patched_graphs_eager": float((seqs["patched"] == seqs["patched_eager"]).float().mean()),
             "tokens_agree_unpatched_graphs_eager":
                 float((seqs["unpatched"] == seqs["unpatched_eager"]).float().mean()),
             "new_tokens": int(seqs["patched"].shape[1]),
             "cuda_graphs": device.type == "cuda"}
    if seqs["patched"].shape[1] != NEW_TOKENS or seqs["unpatched"].shape[1] != NEW_TOKENS:
        raise RuntimeError(f"generate made {seqs['patched'].shape[1]}/{seqs['unpatched'].shape[1]} new tokens, "
                           f"not {NEW_TOKENS}")
    print(f"  graphs B={B}: tokens patched==unpatched {check['tokens_agree_patched_unpatched']:.3f} "
          f"(first token {check['first_token_agree_patched_unpatched']:.3f}), "
          f"patched graphs==eager {check['tokens_agree_patched_graphs_eager']:.3f}"
          + ("" if device.type == "cuda" else " (CPU: no CUDA graphs, generate runs eager)"))
    return case_result(shape, "graphs", B, B * NEW_TOKENS, ab(model, moes, fns, args, device, warmup=2), check)


def patch_time(shape: str, args) -> dict:
    """moekit.transformers.patch on a CPU bf16 model: seconds, the MoE blocks' weight
    bytes, and a plain copy (torch.empty_like(w).copy_(w)) of the same tensors; then an
    in-place refit of every patched block (what follows an optimizer step), median of 3."""
    print(f"\n== {shape}{' (small)' if args.small else ''}: patch time on the CPU")
    model = build(shape, args.small, torch.device("cpu"))
    blocks = [layer.mlp for layer in model.model.layers]
    weights = [t for b in blocks for t in b.state_dict().values()]
    nbytes = sum(t.numel() * t.element_size() for t in weights)
    copies = []
    for _ in range(3):
        t0 = time.perf_counter()
        for w in weights:
            torch.empty_like(w).copy_(w)
        copies.append(time.perf_counter() - t0)
    copy_s = statistics.median(copies)
    t0 = time.perf_counter()
    report = mt.patch(model)
    patch_s = time.perf_counter() - t0
    moes = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, moekit.nn.MoE)]
    natives = [m.layer._layer for m in moes]
    refits = []
    for _ in range(3):
        t0 = time.perf_counter()
        for m in moes:
            m.refit()
        refits.append(time.perf_counter() - t0)
    if any(m.layer._layer is not n for m, n in zip(moes, natives)):
        raise RuntimeError("refit made new layers instead of updating them in place")
    refit_s = statistics.median(refits)
    mt.unpatch(model)
    r = {"patch_s": patch_s, "weight_bytes": nbytes, "copy_s": copy_s, "copy_s_all": copies,
         "copy_GB_per_s": nbytes / copy_s / 1e9, "patch_minus_copy_s": patch_s - copy_s,
         "target": f"< {PATCH_TARGET_S} s plus the copy", "met": patch_s - copy_s < PATCH_TARGET_S,
         "patched_layers": len(report["patched"]), "left": report["left"], "threads": torch.get_num_threads(),
         "refit_in_place_s": refit_s, "refit_in_place_s_all": refits}
    print(f"  patch {patch_s:.3f} s for {nbytes / 1e9:.3f} GB of MoE weights; a copy of those bytes "
          f"{copy_s:.3f} s ({r['copy_GB_per_s']:.2f} GB/s); patch - copy {patch_s - copy_s:.3f} s "
          f"(target < {PATCH_TARGET_S} s: {'met' if r['met'] else 'NOT met'}); "
          f"{len(report['patched'])} patched, {len(report['left'])} left; in-place refit {refit_s:.3f} s")
    return r


def versions(device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or
                                                                             platform.machine())
    return {"torch": torch.__version__, "transformers": transformers.__version__, "moekit": moekit.__version__,
            "python": platform.python_version(), "device": str(device), "device_name": name,
            "cuda": torch.version.cuda}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--cases", default=None,
                    help="comma list of decode,compile,prefill,graphs,eager_experts,train (default: "
                         "decode,compile,prefill,eager_experts,train; on the CPU decode,prefill)")
    ap.add_argument("--graphs", action="store_true", help="add the graphs case")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="shrink every shape (a CPU test)")
    ap.add_argument("--patch-time", action="store_true", help="time patch on CPU models instead (runs anywhere)")
    ap.add_argument("--out", default="transformers_speed.json")
    args = ap.parse_args(argv)
    transformers.logging.set_verbosity_error()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown {s!r} (known: {', '.join(SHAPES)})")
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)

    if args.patch_time:
        device = torch.device("cpu")
        result = {"versions": versions(device), "args": vars(args),
                  "patch_time": {s: patch_time(s, args) for s in shapes}}
        print(f"\n{'shape':16s} {'patch s':>9s} {'GB':>8s} {'copy s':>8s} {'GB/s':>7s} {'patch-copy s':>12s}  met")
        for s, r in result["patch_time"].items():
            print(f"{s:16s} {r['patch_s']:9.3f} {r['weight_bytes'] / 1e9:8.3f} {r['copy_s']:8.3f} "
                  f"{r['copy_GB_per_s']:7.2f} {r['patch_minus_copy_s']:12.3f}  {'yes' if r['met'] else 'no'}")
        ok = all(not r["left"] for r in result["patch_time"].values())
    else:
        device = torch.device(args.device)
        default_cases = "decode,compile,prefill,eager_experts,train" if device.type == "cuda" else "decode,prefill"
        cases = [c for c in (args.cases or default_cases).split(",") if c] + (["graphs"] if args.graphs else [])
        for c in cases:
            if c not in ("decode", "compile", "prefill", "graphs", "eager_experts", "train"):
                ap.error(f"--cases: unknown {c!r}")
        result = {"versions": versions(device), "args": vars(args), "cases": cases,
                  "shapes": {s: run_shape(s, args, device, cases) for s in shapes}}
        print(f"\n{'shape':16s} {'case':26s} {'unpatched tok/s':>16s} {'patched tok/s':>14s} {'speedup':>8s} "
              f"{'target':>7s}  met")
        ok, notes = True, []
        for s, r in result["shapes"].items():
            ok &= r["valid"]
            if not r["valid"]:
                print(f"{s:16s} INVALID: MoE layers left to transformers: {r['report']['left']}")
            for c in r["cases"]:
                name = (f"{c['case']} B={c['batch']}" if not c["case"].startswith("prefill") else
                        f"{c['case']} {c['tokens_per_call']}")
                target = f"{c['target']}x" if c.get("target") else "-"
                for variant, note in c.get("compile", {}).items():
                    if note.get("fullgraph") is not True:
                        e = note.get("explain", {})
                        breaks = e.get("graph_break_count", "?")
                        how = ("compile failed" if "fullgraph" not in note else
                               f"fullgraph=True failed, default compile: {breaks} graph breaks")
                        notes.append(f"{s} {name} {variant}: {how}")
                if c.get("error"):
                    notes.append(f"{s} {name}: {brief(c['error'])}")
                if c.get("failed"):
                    ok &= c["case"] == "graphs"  # graphs is optional: printed, the run goes on
                    print(f"{s:16s} {name:26s} {'FAILED':>16s} {'':>14s} {'':>8s} {target:>7s}  no")
                    continue
                met = "-" if c["met"] is None else ("yes" if c["met"] else "no")
                print(f"{s:16s} {name:26s} {c['unpatched']['tokens_per_s']:16.1f} "
                      f"{c['patched']['tokens_per_s']:14.1f} {c['speedup']:7.2f}x {target:>7s}  {met}")
        for n in notes:
            print("note: " + n)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\nwrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
