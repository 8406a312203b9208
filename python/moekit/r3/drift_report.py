"""moekit.r3.drift: how far two routers' decisions are apart (e.g. the engine's logits and the
trainer's for the same tokens), per MoE layer, computed with the routing kernel itself."""
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..layer import route

Logits = Union[torch.Tensor, Sequence[torch.Tensor]]


def _keys(logits: torch.Tensor, method: str, score_bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The selection key of docs/routing.md section 3: the logit, or for deepseek_v3 the biased sigmoid
    (group selection is not part of the margin)."""
    x = logits.float()
    if method != "deepseek_v3":
        return x
    b = torch.sigmoid(x)
    return b + score_bias.float() if score_bias is not None else b


def drift(logits_a: Logits, logits_b: Logits, cfg, score_bias: Optional[torch.Tensor] = None,
          tie_margin: float = 1e-3) -> List[Dict[str, float]]:
    """Per MoE layer l (logits [L, M, E] or a list of [M, E]): routes both with cfg and reports
      id_agreement      fraction of (token, slot) with the same id at the same slot,
      set_agreement     mean |ids_a & ids_b| / k,
      changed_tokens    fraction of tokens whose top-k set changes,
      weight_max_abs    max |w_a - w_b| over tokens whose set is unchanged (ids aligned by expert),
      margin_min / margin_median   the selection-key gap between a's k-th choice and its best unchosen
                        expert (how close a's decision was to a tie), and
      near_ties         fraction of tokens of a with that gap below tie_margin."""
    la = list(logits_a) if not isinstance(logits_a, torch.Tensor) or logits_a.dim() == 3 else [logits_a]
    lb = list(logits_b) if not isinstance(logits_b, torch.Tensor) or logits_b.dim() == 3 else [logits_b]
    if len(la) != len(lb):
        raise ValueError(f"drift: {len(la)} layers of logits_a, {len(lb)} of logits_b")
    k, E = cfg.top_k, cfg.num_experts
    out = []
    for l, (a, b) in enumerate(zip(la, lb)):
        if a.shape != b.shape or a.dim() != 2 or a.shape[1] != E:
            raise ValueError(f"drift: layer {l}: logits must both be [M, {E}], got {list(a.shape)} and {list(b.shape)}")
        ia, wa = route(a.contiguous(), cfg, score_bias=score_bias)
        ib, wb = route(b.contiguous(), cfg, score_bias=score_bias)
        M = a.shape[0]
        sa, oa = ia.long().sort(dim=1)
        sb, ob = ib.long().sort(dim=1)
        same_set = (sa == sb).all(dim=1)
        inter = (ia.long()[:, :, None] == ib.long()[:, None, :]).any(dim=2).sum(dim=1).float()
        wdiff = (wa.gather(1, oa) - wb.gather(1, ob)).abs()[same_set]
        key = _keys(a, cfg.routing, score_bias)
        chosen = torch.zeros_like(key, dtype=torch.bool).scatter(1, ia.long(), True)
        kth = key.gather(1, ia.long()).min(dim=1).values
        rest = key.masked_fill(chosen, float("-inf")).max(dim=1).values if k < E else torch.full_like(kth, float("inf"))
        margin = (kth - rest)
        out.append({
            "layer": l,
            "tokens": M,
            "id_agreement": float((ia == ib).float().mean()) if M else 1.0,
            "set_agreement": float(inter.mean() / k) if M else 1.0,
            "changed_tokens": float((~same_set).float().mean()) if M else 0.0,
            "weight_max_abs": float(wdiff.max()) if wdiff.numel() else 0.0,
            "margin_min": float(margin.min()) if M else float("inf"),
            "margin_median": float(margin.median()) if M else float("inf"),
            "near_ties": float((margin < tie_margin).float().mean()) if M else 0.0,
        })
    return out
