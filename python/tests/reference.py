"""An independent fp64 truth for the tests: the routing spec (docs/routing.md) and
the MoE layer written as plain torch float64 loops. It shares no code with moekit."""
import math

import torch

METHODS = ["softmax_topk", "renormalize", "renormalize_naive", "topk", "sigmoid", "sigmoid_renorm", "llama4",
           "deepseek_v3"]


def _rank(keys: torch.Tensor, candidates, k: int):
    """The k best of `candidates` by key: higher first, equal keys -> lower index first."""
    return sorted(candidates, key=lambda e: (-keys[e].item(), e))[:k]


def route(logits: torch.Tensor, method: str, k: int, num_groups: int = 1, topk_groups: int = 1,
          scaling: float = 1.0, bias=None):
    """(ids [M, k] int32, weights [M, k] float64) for fp32 logits [M, E]."""
    x = logits.double()
    M, E = x.shape
    ids = torch.empty((M, k), dtype=torch.int32)
    weights = torch.empty((M, k), dtype=torch.float64)
    for t in range(M):
        row = x[t]
        if method == "deepseek_v3":
            s = torch.sigmoid(row)
            b = s + (bias.double() if bias is not None else 0.0)
            per = E // num_groups
            group_score = [sum(sorted(b[g * per:(g + 1) * per].tolist(), reverse=True)[:2]) for g in range(num_groups)]
            kept = sorted(range(num_groups), key=lambda g: (-group_score[g], g))[:topk_groups]
            chosen = _rank(b, [e for g in sorted(kept) for e in range(g * per, (g + 1) * per)], k)
            w = torch.stack([s[e] for e in chosen])
            w = w / w.sum() * scaling
        else:
            chosen = _rank(row, range(E), k)  # every other method's score is increasing in the logit
            sel = torch.stack([row[e] for e in chosen])
            if method in ("softmax_topk", "renormalize_naive"):
                p = torch.softmax(row, 0)
                w = torch.stack([p[e] for e in chosen])
                if method == "renormalize_naive":
                    w = w / w.sum()
            elif method == "renormalize":
                w = torch.softmax(sel, 0)
            elif method == "topk":
                w = sel
            elif method in ("sigmoid", "sigmoid_renorm", "llama4"):
                w = torch.sigmoid(sel)
                if method == "sigmoid_renorm":
                    w = w / w.sum()
            else:
                raise ValueError(method)
        ids[t] = torch.tensor(chosen, dtype=torch.int32)
        weights[t] = w
    return ids, weights


def moe(hidden, w13, w2, ids, weights, activation: str = "silu"):
    """out [M, H] float64 = sum_j weights[t, j] * W2[e] act(W13[e] x), e = ids[t, j]."""
    x, a13, a2 = hidden.double(), w13.double(), w2.double()
    M, H = x.shape
    I = a2.shape[2]
    out = torch.zeros((M, H), dtype=torch.float64)
    for t in range(M):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            z = a13[e] @ x[t]
            if activation == "silu":
                act = torch.nn.functional.silu(z[:I]) * z[I:]
            elif activation == "gelu":
                g = z[:I]
                act = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * z[I:]
            else:
                raise ValueError(activation)
            out[t] += float(weights[t, j]) * (a2[e] @ act)
    return out


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (inf for a non-finite output, so it never passes)."""
    o = out.double()
    if not torch.isfinite(o).all():
        return math.inf
    return (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item()


def replay_weights(logits: torch.Tensor, ids: torch.Tensor, method: str, scaling: float = 1.0,
                   renormalize: bool = True) -> torch.Tensor:
    """The spec's weights at forced ids (docs/routing.md section 6), row by row in float64 with plain torch
    ops, so autograd gives the spec's gradient with respect to the logits. Zero-sum rule: 1/k weights.
    renormalize=False (deepseek_v3's flag; other methods ignore it): sigmoid(x_f) * scaling, no division."""
    x = logits.double()
    M, k = ids.shape
    rows = []
    for t in range(M):
        row, f = x[t], [int(e) for e in ids[t]]
        sel = torch.stack([row[e] for e in f])
        if method == "softmax_topk":
            p = torch.exp(row - row.max()) / torch.exp(row - row.max()).sum()
            w = torch.stack([p[e] for e in f])
        elif method in ("renormalize", "renormalize_naive"):
            e = torch.exp(sel - sel.max())
            w = e / e.sum()
        elif method == "topk":
            w = sel
        elif method in ("sigmoid", "llama4"):
            w = 1 / (1 + torch.exp(-sel))
        elif method == "deepseek_v3" and not renormalize:
            w = scaling / (1 + torch.exp(-sel))
        elif method in ("sigmoid_renorm", "deepseek_v3"):
            s = 1 / (1 + torch.exp(-sel))
            w = s / s.sum() if float(s.detach().sum()) > 0 else torch.full_like(s, 1.0 / k)
            if method == "deepseek_v3":
                w = w * scaling
        else:
            raise ValueError(method)
        rows.append(w)
    return torch.stack(rows)
