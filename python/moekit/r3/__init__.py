"""moekit.r3: rollout routing replay (R3) glue — the capture format read and written with NumPy,
converters to and from engines' and trainers' layouts, the validator, a per-request store for
schedulers, and a drift report. docs/r3.md."""
from .check import CheckReport, check
from .convert import (from_megatron, from_padded_batch, from_sglang, from_vllm, to_megatron, to_padded_batch,
                      to_sglang, to_vllm)
from .format import Capture, RequestRoutes, read_capture, routing_dict, write_capture
from .store import RoutingStore


def drift(logits_a, logits_b, cfg, score_bias=None, tie_margin: float = 1e-3):
    """Per MoE layer: id agreement, changed top-k sets, weight differences and tie margins (r3/drift_report.py)."""
    from .drift_report import drift as _drift
    return _drift(logits_a, logits_b, cfg, score_bias, tie_margin)


__all__ = ["Capture", "CheckReport", "RequestRoutes", "RoutingStore", "check", "drift", "from_megatron",
           "from_padded_batch", "from_sglang", "from_vllm", "read_capture", "routing_dict", "to_megatron",
           "to_padded_batch", "to_sglang", "to_vllm", "write_capture"]
