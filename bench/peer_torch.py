#!/usr/bin/env python3
"""The PyTorch peer of the GPU MoE benchmark.

Runs the same MoE layers as bench/gpu_moe_bench.cu through PyTorch: routing,
permutation and combine in torch, the expert GEMMs through torch._grouped_mm.
Inputs are regenerated bit for bit from the seeds the moekit run recorded in its
JSON (the recipe of bench/gpu_fill.h), so both compute the same layer on the
same data. Each case is timed the same way (one CUDA graph per input set,
launched round-robin, events between launches, median), and where the moekit
run dumped its output the two outputs are compared.

  python3 bench/peer_torch.py --moekit-json out/moekit.json --dump-dir out/dumps --json out/peer.json
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# ||peer - moekit|| / ||moekit|| bound for the dumped outputs. Both are bf16
# layers with bf16 intermediates and fp32 accumulation; each lands ~2e-3..4e-3
# from the fp64 truth on these inputs, so two independent roundings differ by
# well under 1e-2; a wrong expert, weight or row gives O(1).
OUTPUT_BOUND = 1e-2

MASK32 = 0xFFFFFFFF


# ---- the seeded fill (NOTE: keep in step with bench/gpu_fill.h) ----
def mix32_int(x):
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def mix32_t(x):
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    x = x ^ (x >> 16)
    return x


def fill_uniform(shape, seed, scale_log2, dtype, device, chunk=1 << 26):
    """Values v(i) = (2*(h(i)>>8)/2^24 - 1) * 2^scale_log2 over the flat index i."""
    n = math.prod(shape)
    out = torch.empty(n, dtype=dtype, device=device)
    seed_mixed = mix32_int(seed)
    scale = math.ldexp(1.0, scale_log2)
    for start in range(0, n, chunk):
        idx = torch.arange(start, min(n, start + chunk), dtype=torch.int64, device=device)
        h = mix32_t((idx & MASK32) ^ mix32_t((idx >> 32) ^ seed_mixed))
        u = (h >> 8).to(torch.float32) * (1.0 / 16777216.0)
        v = (2.0 * u - 1.0) * scale
        out[start:start + idx.numel()] = v.to(dtype)
        del idx, h, u, v
    return out.view(shape)


# ---- the benchmark's inputs, from the moekit JSON (shared by every peer) ----
def shape_weights(shape, dev):
    """(w13 [E, N13, H] bf16, w2 [E, H, I] bf16, score bias [E] f32 or None) of a shape."""
    e, h, i = shape["experts"], shape["hidden"], shape["intermediate"]
    n13 = 2 * i if shape["activation"] != "relu2" else i
    w13 = fill_uniform((e, n13, h), shape["w13_seed"], shape["w13_scale_log2"], torch.bfloat16, dev)
    w2 = fill_uniform((e, h, i), shape["w2_seed"], shape["w2_scale_log2"], torch.bfloat16, dev)
    bias = None
    if shape.get("score_bias"):
        bias = fill_uniform((e,), shape["bias_seed"], shape["bias_scale_log2"], torch.float32, dev)
    return w13, w2, bias


def case_inputs(shape, case, sets, dev):
    """[(hidden [M, H] bf16, logits [M, E] f32)] per input set; the skewed variant's
    per-expert logit offsets (f32, in the JSON) are added in f32, as moekit does."""
    m, e, h = case["m"], shape["experts"], shape["hidden"]
    offsets = shape.get("logit_offsets")
    off = torch.tensor(offsets, dtype=torch.float32, device=dev) if offsets else None
    inputs = []
    for s in range(sets):
        hid = fill_uniform((m, h), case["hidden_seeds"][s], case["hidden_scale_log2"], torch.bfloat16, dev)
        lg = fill_uniform((m, e), case["logits_seeds"][s], case["logits_scale_log2"], torch.float32, dev)
        if off is not None:
            lg = lg + off
        inputs.append((hid, lg))
    return inputs


# ---- the layer in torch ----
def route(shape, logits, bias):
    k = shape["top_k"]
    method = shape["routing"]
    if method == "renormalize":
        vals, ids = torch.topk(logits, k, dim=-1)
        return ids, torch.softmax(vals, dim=-1)
    if method == "softmax_topk":
        p = torch.softmax(logits, dim=-1)
        vals, ids = torch.topk(p, k, dim=-1)
        return ids, vals
    if method == "deepseek_v3":
        m, e = logits.shape
        groups, kept = shape["num_groups"], shape["topk_groups"]
        s = torch.sigmoid(logits)
        b = s + bias if bias is not None else s
        group_scores = b.view(m, groups, e // groups).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(kept, dim=-1).indices, True)
        masked = b.masked_fill(~keep.repeat_interleave(e // groups, dim=1), float("-inf"))
        ids = masked.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * shape["routed_scaling_factor"]
        return ids, w
    raise ValueError(f"peer: routing {method} not implemented")


def activate(shape, h):
    """h: [rows, N13] bf16 (checkpoint row order) -> [rows, I] bf16."""
    act = shape["activation"]
    hf = h.float()
    if act == "silu":
        i = hf.shape[1] // 2
        a = F.silu(hf[:, :i]) * hf[:, i:]
    elif act == "gelu":
        i = hf.shape[1] // 2
        a = F.gelu(hf[:, :i], approximate="tanh") * hf[:, i:]
    elif act == "swiglu_oai":
        limit, alpha = shape["swiglu_limit"], shape["swiglu_alpha"]
        g = hf[:, 0::2].clamp(max=limit)
        u = hf[:, 1::2].clamp(min=-limit, max=limit)
        a = g * torch.sigmoid(alpha * g) * (u + 1.0)
    elif act == "relu2":
        a = torch.relu(hf).square()
    else:
        raise ValueError(f"peer: activation {act} not implemented")
    return a.to(torch.bfloat16)


def make_layer(shape, w13_t, w2_t, bias):
    e, k = shape["experts"], shape["top_k"]

    def layer(hidden, logits):
        m = hidden.shape[0]
        ids, w = route(shape, logits, bias)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // k
        ends = torch.searchsorted(flat[order].contiguous(),
                                  torch.arange(1, e + 1, device=flat.device, dtype=flat.dtype)).to(torch.int32)
        x = hidden.index_select(0, token)
        h = torch._grouped_mm(x, w13_t, offs=ends)
        a = activate(shape, h)
        y = torch._grouped_mm(a, w2_t, offs=ends)
        y = y.float() * w.reshape(-1)[order].unsqueeze(1)
        out = torch.zeros(m, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        out.index_add_(0, token, y)
        return out.to(torch.bfloat16)

    return layer


def time_graphs(fns, seconds, min_reps):
    """One CUDA graph per input set, launched round-robin; median launch time (s)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graphs, outs = [], []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(fn())
        graphs.append(g)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(2):
        for g in graphs:
            g.replay()
    t1.record()
    torch.cuda.synchronize()
    est = max(1e-6, t0.elapsed_time(t1) * 1e-3 / (2 * len(graphs)))
    reps = min(500, max(min_reps, int(seconds / (est * len(graphs)))))
    launches = reps * len(graphs)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(launches + 1)]
    ev[0].record()
    for i in range(launches):
        graphs[i % len(graphs)].replay()
        ev[i + 1].record()
    torch.cuda.synchronize()
    secs = sorted(ev[i].elapsed_time(ev[i + 1]) * 1e-3 for i in range(launches))
    return secs[len(secs) // 2], graphs, outs


def rel_l2(out, ref):
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-300))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moekit-json", required=True, help="JSON written by moekit_gpu_bench")
    ap.add_argument("--dump-dir", default="", help="where moekit_gpu_bench dumped its outputs")
    ap.add_argument("--json", default="", help="write the peer's results here")
    ap.add_argument("--seconds", type=float, default=0.25)
    ap.add_argument("--min-reps", type=int, default=3)
    args = ap.parse_args()

    with open(args.moekit_json) as f:
        mk = json.load(f)
    dev = torch.device("cuda")
    sets = mk["num_sets"]
    results, failures = [], []
    for shape in mk["shapes"]:
        cases = [c for c in mk["cases"] if c["shape"] == shape["name"]]
        if not cases:
            continue
        w13, w2, bias = shape_weights(shape, dev)
        # [G, K, N] views of the [G, N, K] weights: column-major B, as _grouped_mm takes it.
        layer = make_layer(shape, w13.transpose(1, 2), w2.transpose(1, 2), bias)
        for case in cases:
            m = case["m"]
            inputs = case_inputs(shape, case, sets, dev)
            fns = [lambda hid=hid, lg=lg: layer(hid, lg) for hid, lg in inputs]
            try:
                t, graphs, outs = time_graphs(fns, args.seconds, args.min_reps)
            except Exception as ex:  # report and go on: one bad case must not hide the others
                failures.append(f"{shape['name']} M={m}: {ex}")
                print("  " + failures[-1], flush=True)
                continue
            r = {"shape": shape["name"], "m": m, "time_us": t * 1e6,
                 "tflops": case["flops"] / t * 1e-12, "frac_floor": case["floor_us"] * 1e-6 / t,
                 "moekit_time_us": case["time_us"], "ratio": case["time_us"] * 1e-6 / t}
            if case.get("dump") and args.dump_dir:
                graphs[0].replay()
                torch.cuda.synchronize()
                ref = torch.from_numpy(np.load(os.path.join(args.dump_dir, case["dump"])).view(np.int16))
                ref = ref.view(torch.bfloat16).to(dev)
                err = rel_l2(outs[0], ref)
                r["rel_l2_vs_moekit"] = err
                r["check"] = "pass" if err <= OUTPUT_BOUND else "FAIL"
                if err > OUTPUT_BOUND:
                    failures.append(f"{shape['name']} M={m}: peer vs moekit rel L2 {err:.3e} > {OUTPUT_BOUND}")
            print(f"  {shape['name']} M={m}: torch {t * 1e6:.1f} us, moekit {case['time_us']:.1f} us"
                  + (f", rel_l2 {r['rel_l2_vs_moekit']:.2e}" if "rel_l2_vs_moekit" in r else ""), flush=True)
            results.append(r)
            del graphs, outs, inputs, fns
            torch.cuda.empty_cache()
        del w13, w2, bias, layer
        torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "cases": results, "failures": failures}, f, indent=1)
    # The summary table, last: moekit's time, rate and fraction of the floor next to the peer's.
    by_case = {(c["shape"], c["m"]): c for c in mk["cases"]}
    print(f"{'shape':<18} {'M':>6} {'moekit_us':>10} {'TFLOP/s':>8} {'%floor':>7} {'torch_us':>10} "
          f"{'t%floor':>7} {'mk/torch':>8} {'check':>14}")
    for r in results:
        c = by_case[(r["shape"], r["m"])]
        chk = f"{r['check']} {r['rel_l2_vs_moekit']:.1e}" if "check" in r else "-"
        print(f"{r['shape']:<18} {r['m']:>6} {c['time_us']:>10.1f} {c['tflops']:>8.1f} {100 * c['frac_floor']:>6.1f}% "
              f"{r['time_us']:>10.1f} {100 * r['frac_floor']:>6.1f}% {r['ratio']:>8.2f} {chk:>14}")
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
