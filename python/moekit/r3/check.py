"""moekit.r3.check: the capture validator of the C++ library (include/moekit/capture_check.h) over a
capture in any of its forms: a capture file, a moekit.CaptureSet, a format.Capture, or plain arrays."""
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _moekit
from .format import Capture, RequestRoutes


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass
class CheckReport:
    """findings: [{kind, request, token, layer, model_layer, slot, message}] (at most
    max_findings_per_kind of each kind); counts: {kind: number of findings}, all of them."""
    findings: List[Dict]
    counts: Dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.counts

    def __str__(self) -> str:
        if self.ok:
            return "ok: no findings"
        lines = [f["message"] for f in self.findings]
        lines += [f"{kind}: {n} finding(s)" for kind, n in sorted(self.counts.items())]
        return "\n".join(lines)

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise ValueError("capture check failed:\n" + str(self))


def _capture_set(cap: Capture):
    r = cap.routing
    for q in cap.requests:  # before any cast: a float id would be truncated, a wide one wrapped
        a = np.asarray(q.ids)
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"request {q.request!r}: ids must be integers, got {a.dtype}")
        if a.size and (a.min() < -32768 or a.max() > 32767):
            raise ValueError(f"request {q.request!r}: ids outside int16 cannot be checked (got {a.min()}..{a.max()})")
    requests = [(q.request, int(q.first_token), int(q.first_generated_token),
                 np.ascontiguousarray(np.asarray(q.ids).astype(np.int16, copy=False)), None) for q in cap.requests]
    return _moekit.capture_set(cap.num_experts, r["method"], int(r["top_k"]), int(r.get("num_groups", 1)),
                               int(r.get("topk_groups", 1)), float(r.get("routed_scaling_factor", 1.0)),
                               bool(r.get("score_bias", False)), list(map(int, cap.model_layers)), requests,
                               cap.backend, "")


def check(capture: Union[str, os.PathLike, Capture, "_moekit.CaptureSet", Mapping[str, np.ndarray]],
          num_experts: Optional[int] = None, model_layers: Optional[Sequence[int]] = None,
          routing: str = "softmax_topk", expected_tokens: Optional[Mapping[str, int]] = None,
          num_physical_experts: int = 0, dense_layers: Sequence[int] = (), min_tokens_constant: int = 8,
          max_findings_per_kind: int = 20, physical_to_logical: Optional[Sequence[int]] = None) -> CheckReport:
    """Checks a capture and names every inconsistency by request, token and layer.

    capture: a file path, a moekit.CaptureSet, a moekit.r3.Capture, or {request: ids [tokens, moe_layers,
    k]} (then num_experts is required; model_layers defaults to 0..L-1, routing to softmax_topk, which
    only matters for the metadata). expected_tokens: {request: rows it should have}.
    num_physical_experts > E: ids in [E, that) are reported as EPLB physical ids; physical_to_logical (an
    EPLB map [P]) does the same with P = its length and names the logical expert. dense_layers: model layers
    without a router (a captured layer among them is reported)."""
    if isinstance(capture, (str, os.PathLike)):
        cs = _moekit.read_capture_file(os.fspath(capture), check_ids=False)
    elif isinstance(capture, _moekit.CaptureSet):
        cs = capture
    else:
        if not isinstance(capture, Capture):
            if num_experts is None:
                raise ValueError("check: arrays need num_experts")
            reqs = [RequestRoutes(name, np.asarray(a)) for name, a in capture.items()]
            shapes = {np.shape(q.ids)[1:] for q in reqs}
            if len(shapes) != 1 or len(next(iter(shapes))) != 2:
                raise ValueError(f"check: every request needs ids [tokens, moe_layers, k], got shapes {sorted(shapes)}")
            L, k = next(iter(shapes))
            capture = Capture(num_experts, list(model_layers) if model_layers is not None else list(range(L)),
                              {"method": routing, "top_k": k, "num_groups": 1, "topk_groups": 1,
                               "routed_scaling_factor": 1.0, "score_bias": False}, reqs)
        cs = _capture_set(capture)
    expected = dict(expected_tokens or {})
    for name, n in expected.items():
        if not isinstance(name, str) or not _is_int(n) or n < 0:
            raise ValueError(f"check: expected_tokens must map request names to token counts >= 0, got "
                             f"{name!r:.60}: {n!r:.40}")
    eplb = list(physical_to_logical) if physical_to_logical is not None else []
    E = int(cs.num_experts)
    if eplb:
        if not all(_is_int(e) for e in eplb):
            raise ValueError("check: physical_to_logical must hold integers (logical expert ids)")
        bad = next((p for p, e in enumerate(eplb) if not 0 <= e < E), None)
        if bad is not None:
            raise ValueError(f"check: physical_to_logical[{bad}] = {eplb[bad]} is not a logical expert (E = {E})")
        if len(eplb) < E:
            raise ValueError(f"check: physical_to_logical has {len(eplb)} physical experts, fewer than the {E} "
                             "logical ones")
    if not _is_int(num_physical_experts) or num_physical_experts < 0:
        raise ValueError(f"check: num_physical_experts must be an integer >= 0, got {num_physical_experts!r}")
    findings, counts = _moekit.check_capture(cs, expected, int(num_physical_experts),
                                             list(map(int, dense_layers)), int(min_tokens_constant),
                                             int(max_findings_per_kind), [int(e) for e in eplb])
    return CheckReport(list(findings), dict(counts))
