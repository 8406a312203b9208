"""Pictures of a capture: expert load per MoE layer and over the run, and where two captures of the same
requests (a rollout and its training forward, say) chose different experts. matplotlib is optional:
only this module needs it.

    python -m moekit.r3.plot CAPTURE [--vs OTHER] -o out.png [--window 64]

The numbers behind each picture are functions of their own (expert_load, load_over_steps,
route_difference), so they can be checked, and used, without drawing.
"""
import argparse
from typing import Dict, List, Optional

import numpy as np

from .format import Capture, read_capture


def expert_load(cap: Capture) -> np.ndarray:
    """[num_moe_layers, num_experts] int64: how many (token, slot) pairs went to each expert, over every
    request's captured tokens (rows of -1, tokens not captured, are left out)."""
    load = np.zeros((cap.num_moe_layers, cap.num_experts), dtype=np.int64)
    for r in cap.requests:
        for layer in range(cap.num_moe_layers):
            ids = r.ids[:, layer, :].reshape(-1)
            load[layer] += np.bincount(ids[ids >= 0].astype(np.int64), minlength=cap.num_experts)
    return load


def busiest_over_mean(load: np.ndarray) -> np.ndarray:
    """Per layer: the busiest expert's load over the mean load (1 is perfectly balanced; 0 for a layer
    with no tokens)."""
    mean = load.mean(axis=1)
    return np.divide(load.max(axis=1), mean, out=np.zeros_like(mean, dtype=np.float64), where=mean > 0)


def load_over_steps(cap: Capture, window: int) -> np.ndarray:
    """[num_windows, num_moe_layers] float64: busiest/mean load per layer in consecutive windows of
    `window` tokens, the requests' tokens taken in file order (a run's steps in the order it served)."""
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    rows = [r.ids for r in cap.requests if r.num_tokens]
    if not rows:
        return np.zeros((0, cap.num_moe_layers))
    ids = np.concatenate(rows, axis=0)  # [tokens, layers, k]
    out = []
    for start in range(0, ids.shape[0], window):
        chunk = ids[start:start + window]
        load = np.stack([np.bincount(c[c >= 0].astype(np.int64), minlength=cap.num_experts)
                         for c in (chunk[:, layer, :].reshape(-1) for layer in range(cap.num_moe_layers))])
        out.append(busiest_over_mean(load))
    return np.stack(out)


def route_difference(a: Capture, b: Capture) -> np.ndarray:
    """[num_moe_layers] float64: per MoE layer, the fraction of tokens whose expert set differs between two
    captures of the same requests (compared by request name and token position; tokens captured in only
    one of them, or in neither, are left out). ValueError when the captures do not describe the same
    layers and experts, or share no captured token."""
    if (a.num_moe_layers, a.num_experts, a.top_k) != (b.num_moe_layers, b.num_experts, b.top_k):
        raise ValueError(f"the captures differ in shape: {a.num_moe_layers} MoE layers, E = {a.num_experts}, "
                         f"k = {a.top_k} against {b.num_moe_layers}, E = {b.num_experts}, k = {b.top_k}")
    differ = np.zeros(a.num_moe_layers, dtype=np.int64)
    compared = np.zeros(a.num_moe_layers, dtype=np.int64)
    for ra in a.requests:
        rb = b.find(ra.request)
        if rb is None:
            continue
        lo, hi = max(ra.first_token, rb.first_token), min(ra.first_token + ra.num_tokens, rb.first_token + rb.num_tokens)
        if hi <= lo:
            continue
        ia = np.sort(ra.ids[lo - ra.first_token:hi - ra.first_token], axis=-1)
        ib = np.sort(rb.ids[lo - rb.first_token:hi - rb.first_token], axis=-1)
        both = (ia >= 0).all(axis=-1) & (ib >= 0).all(axis=-1)  # [tokens, layers]
        differ += ((ia != ib).any(axis=-1) & both).sum(axis=0)
        compared += both.sum(axis=0)
    if not compared.any():
        raise ValueError("the captures share no captured token (no request name and position in both)")
    return np.divide(differ, compared, out=np.zeros(a.num_moe_layers), where=compared > 0)


def plot(capture, out_png, vs=None, window: int = 64, title: Optional[str] = None) -> Dict[str, np.ndarray]:
    """Draws a capture (a Capture or a file path) into out_png: the load heatmap (MoE layers x experts,
    each layer's busiest/mean ratio beside it) and the busiest/mean ratio over windows of `window` tokens;
    with `vs` (a second capture of the same requests), the fraction of tokens per layer whose expert set
    differs. Returns the numbers drawn: {"load", "busiest_over_mean", "over_steps"[, "differ"]}."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("moekit.r3.plot needs matplotlib (pip install matplotlib)") from e
    cap = capture if isinstance(capture, Capture) else read_capture(capture)
    other = None if vs is None else (vs if isinstance(vs, Capture) else read_capture(vs))
    numbers = {"load": expert_load(cap)}
    numbers["busiest_over_mean"] = busiest_over_mean(numbers["load"])
    numbers["over_steps"] = load_over_steps(cap, window)
    if other is not None:
        numbers["differ"] = route_difference(cap, other)

    panels = 3 if other is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    ax = axes[0][0]
    load = numbers["load"]
    share = load / np.maximum(load.sum(axis=1, keepdims=True), 1)
    im = ax.imshow(share, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("model layer: busiest/mean load")
    ax.set_yticks(range(cap.num_moe_layers), [f"{m}: {ratio:.2f}x" for m, ratio in
                                              zip(cap.model_layers, numbers["busiest_over_mean"])])
    ax.set_title("share of each layer's routed tokens per expert")
    fig.colorbar(im, ax=ax, fraction=0.04)

    ax = axes[0][1]
    steps = numbers["over_steps"]
    for layer in range(cap.num_moe_layers):
        ax.plot(np.arange(steps.shape[0]) * window, steps[:, layer], label=f"layer {cap.model_layers[layer]}")
    ax.set_xlabel(f"token (windows of {window})")
    ax.set_ylabel("busiest / mean load")
    ax.set_title("load imbalance over the run")
    if cap.num_moe_layers <= 12:
        ax.legend(fontsize=7)

    if other is not None:
        ax = axes[0][2]
        ax.bar(range(cap.num_moe_layers), numbers["differ"])
        ax.set_xticks(range(cap.num_moe_layers), [str(m) for m in cap.model_layers])
        ax.set_ylim(0, max(1e-3, float(numbers["differ"].max()) * 1.15))
        ax.set_xlabel("model layer")
        ax.set_ylabel("fraction of tokens")
        ax.set_title("tokens whose expert set differs")
    fig.suptitle(title or f"{len(cap.requests)} requests, E = {cap.num_experts}, k = {cap.top_k}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return numbers


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m moekit.r3.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("capture", help="a moekit capture file")
    p.add_argument("--vs", help="a second capture of the same requests: where their expert sets differ")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    p.add_argument("--window", type=int, default=64, help="tokens per point of the load-over-the-run curve")
    args = p.parse_args(argv)
    numbers = plot(args.capture, args.out, vs=args.vs, window=args.window)
    ratios = ", ".join(f"{r:.2f}" for r in numbers["busiest_over_mean"])
    print(f"{args.out}: busiest/mean load per MoE layer {ratios}")
    if "differ" in numbers:
        print("tokens whose expert set differs, per MoE layer: " + ", ".join(f"{d:.3f}" for d in numbers["differ"]))


if __name__ == "__main__":
    main()
