"""Trainer-side routing replay: the router weights of forced expert ids, with gradients.

    weights = moekit.torch.replay_routing(router_logits, forced_ids, cfg, score_bias=None)
    out = moekit.torch.replayed_moe(layer, hidden, router_logits, forced_ids, experts)

replayed_moe is the training path of a replayed MoE layer: its value is the
moekit layer's forward with the ids forced (bit for bit the rollout's), its
gradients those of the same forced routing evaluated in torch (`experts`, e.g.
forced_experts on the checkpoint's weights), so hidden, the router (through
replay_routing) and the expert weights all get theirs.

The forward is the routing kernel itself (moekit.route with forced ids, on the
logits' device), so the weights are bit for bit those the layer computes for
those ids. The backward is the derivative of the spec's weight formula
(docs/routing.md, section 6) with respect to the dense logits [M, E]: a
trainer that replays a rollout's experts still trains its router. float64
logits run the spec's formulas in float64 in torch (for gradcheck; no kernel
computes in float64). docs/r3.md, "Trainer-side replay".
"""
from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional, Union

import torch

from . import _moekit
from . import ops as _ops
from ._torch import tensor_arg

def _sigmoid(v: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-v))


def _renormalized(v: torch.Tensor, k: int) -> torch.Tensor:
    """v / sum(v) per row; a zero sum gives 1/k (the spec's zero-sum rule)."""
    tot = v.sum(1, keepdim=True)
    return torch.where(tot > 0, v / torch.where(tot > 0, tot, 1), torch.full_like(v, 1.0 / k))


def _sigmoid_renorm_grad(s: torch.Tensor, g: torch.Tensor, c: float) -> torch.Tensor:
    """d(sum g * c s / S)/dx_f for s = sigmoid(x_f), S = sum s: c (g - sum(g s) / S) / S * s (1 - s)."""
    tot = s.sum(1, keepdim=True)
    safe = torch.where(tot > 0, tot, torch.ones_like(tot))
    return c * (g - (g * s).sum(1, keepdim=True) / safe) / safe * (tot > 0) * s * (1 - s)


class _WeightRule(NamedTuple):
    """One method's weight formula (docs/routing.md, section 6) and its derivative.
    forward(x, xf, ids, scale, renormalize) -> w [M, k]; backward(x, xf, ids, w, g, scale, renormalize) ->
    d(sum g * w)/dx, dense [M, E]. x [M, E] logits, xf = x at the ids, ids [M, k] int64."""
    forward: Callable
    backward: Callable


def _scatter(x, ids, v):
    return torch.zeros_like(x).scatter(1, ids, v)


def _renormalize_naive_backward(x, xf, ids, w, g, scale, renorm):
    # equal to softmax(x_f) in exact arithmetic; the zero-sum rule makes w a constant 1/k
    alive = torch.exp(xf - x.max(dim=1, keepdim=True).values).sum(1, keepdim=True) > 0
    return _scatter(x, ids, w * (g - (g * w).sum(1, keepdim=True)) * alive)


def _deepseek_v3_forward(x, xf, ids, scale, renorm):
    s = _sigmoid(xf)
    return (_renormalized(s, ids.shape[1]) if renorm else s) * scale  # renormalize=False: no division


def _deepseek_v3_backward(x, xf, ids, w, g, scale, renorm):
    s = _sigmoid(xf)
    return _scatter(x, ids, _sigmoid_renorm_grad(s, g, scale) if renorm else g * scale * s * (1 - s))


# Every routing method of the library has an entry here or in _NO_WEIGHTS; checked at import
# against moekit._moekit.routing_methods(), so a method added to the spec cannot replay silently wrong.
_WEIGHT_RULES: Dict[str, _WeightRule] = {
    "softmax_topk": _WeightRule(  # w_j = p_{f_j}: dw_j/dx_i = w_j (delta - p_i)
        lambda x, xf, ids, scale, renorm: torch.softmax(x, dim=1).gather(1, ids),
        lambda x, xf, ids, w, g, scale, renorm: (-torch.softmax(x, dim=1) * (g * w).sum(1, keepdim=True))
        .scatter_add(1, ids, g * w)),
    "renormalize": _WeightRule(
        lambda x, xf, ids, scale, renorm: torch.softmax(xf, dim=1),
        lambda x, xf, ids, w, g, scale, renorm: _scatter(x, ids, w * (g - (g * w).sum(1, keepdim=True)))),
    "renormalize_naive": _WeightRule(
        lambda x, xf, ids, scale, renorm: _renormalized(torch.exp(xf - x.max(dim=1, keepdim=True).values),
                                                        ids.shape[1]),
        _renormalize_naive_backward),
    "topk": _WeightRule(
        lambda x, xf, ids, scale, renorm: xf.clone(),
        lambda x, xf, ids, w, g, scale, renorm: _scatter(x, ids, g)),
    "sigmoid": _WeightRule(
        lambda x, xf, ids, scale, renorm: _sigmoid(xf),
        lambda x, xf, ids, w, g, scale, renorm: _scatter(x, ids, g * _sigmoid(xf) * (1 - _sigmoid(xf)))),
    "sigmoid_renorm": _WeightRule(
        lambda x, xf, ids, scale, renorm: _renormalized(_sigmoid(xf), ids.shape[1]),
        lambda x, xf, ids, w, g, scale, renorm: _scatter(x, ids, _sigmoid_renorm_grad(_sigmoid(xf), g, 1.0))),
    "llama4": _WeightRule(  # selection differs from sigmoid's; the weights do not
        lambda x, xf, ids, scale, renorm: _sigmoid(xf),
        lambda x, xf, ids, w, g, scale, renorm: _scatter(x, ids, g * _sigmoid(xf) * (1 - _sigmoid(xf)))),
    "deepseek_v3": _WeightRule(_deepseek_v3_forward, _deepseek_v3_backward),
}
_NO_WEIGHTS = ("custom",)  # the caller supplies the weights: nothing to replay


def _check_rules_cover(methods) -> None:
    """Each of the library's routing methods has a weight rule or is listed in _NO_WEIGHTS, and nothing else."""
    missing = [m for m in methods if m not in _WEIGHT_RULES and m not in _NO_WEIGHTS]
    unknown = [m for m in list(_WEIGHT_RULES) + list(_NO_WEIGHTS) if m not in methods]
    if missing or unknown:
        raise RuntimeError(f"moekit.torch: the weight rules do not match the library's routing methods "
                           f"(no rule for {missing}, rules for unknown {unknown})")


_check_rules_cover(_moekit.routing_methods())


def _rule(method: str) -> _WeightRule:
    if method not in _WEIGHT_RULES:
        raise ValueError(f"replay_routing: routing method {method!r} has no weights to replay")
    return _WEIGHT_RULES[method]


def _spec_forward_f64(x: torch.Tensor, ids: torch.Tensor, method: str, scale: float,
                      renormalize: bool = True) -> torch.Tensor:
    """The section 6 formula of `method` in x's dtype (float64), ids [M, k] int64. renormalize=False
    (deepseek_v3 only; other methods ignore the flag): w = sigmoid(x_f) * scale, no division."""
    return _rule(method).forward(x, x.gather(1, ids), ids, scale, renormalize)


def _spec_backward(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, g: torch.Tensor, method: str,
                   scale: float, renormalize: bool = True) -> torch.Tensor:
    """d(sum g * w)/dx for the section 6 formulas, dense [M, E], in x's dtype (w = the forward's weights)."""
    return _rule(method).backward(x, x.gather(1, ids), ids, w, g, scale, renormalize)


@dataclass(frozen=True)
class RoutingSpec:
    """What replay_routing needs of a MoeConfig, as plain values (routing_spec(cfg)): a call given one
    compiles with torch.compile(fullgraph=True), since it touches no native object."""
    method: str
    num_experts: int
    top_k: int
    scale: float
    renormalize: bool
    config: int  # the config's handle for torch.ops.moekit.replay_weights


def routing_spec(cfg: "_moekit.MoeConfig") -> RoutingSpec:
    """The RoutingSpec of a MoeConfig (equal configs give equal specs)."""
    if not isinstance(cfg, _moekit.MoeConfig):
        raise TypeError(f"cfg: expected a moekit.MoeConfig, got {type(cfg).__module__}.{type(cfg).__qualname__}")
    return RoutingSpec(cfg.routing, int(cfg.num_experts), int(cfg.top_k), float(cfg.routed_scaling_factor),
                       bool(cfg.renormalize), _ops.register_config(cfg))


def _setup_replay_weights(ctx, inputs, output):
    logits, ids, _, handle = inputs
    cfg = _ops.config_of(handle)
    ctx.save_for_backward(logits, ids.long(), output)
    ctx.method, ctx.scale, ctx.renormalize = cfg.routing, float(cfg.routed_scaling_factor), bool(cfg.renormalize)


def _backward_replay_weights(ctx, g):
    logits, ids, w = ctx.saved_tensors
    grad = _spec_backward(logits.float(), ids, w, g.float(), ctx.method, ctx.scale, ctx.renormalize)
    return grad.to(logits.dtype), None, None, None


_ops.replay_weights.register_autograd(_backward_replay_weights, setup_context=_setup_replay_weights)


class _ReplayRoutingF64(torch.autograd.Function):
    """The float64 form (gradient checks): the section 6 formulas in torch, both ways."""

    @staticmethod
    def forward(ctx, logits, ids, spec):
        ids64 = ids.long()
        w = _spec_forward_f64(logits, ids64, spec.method, spec.scale, spec.renormalize)
        ctx.save_for_backward(logits, ids64, w)
        ctx.spec = spec
        return w

    @staticmethod
    def backward(ctx, g):
        logits, ids, w = ctx.saved_tensors
        s = ctx.spec
        return _spec_backward(logits, ids, w, g.to(logits.dtype), s.method, s.scale, s.renormalize), None, None


def replay_routing(router_logits: torch.Tensor, forced_ids: torch.Tensor,
                   cfg: Union["_moekit.MoeConfig", RoutingSpec], score_bias: Optional[torch.Tensor] = None,
                   check_ids: bool = True) -> torch.Tensor:
    """weights [M, k] float32 of `forced_ids` [M, k] (int32/int64/int16; logical ids in [0, E), distinct
    per row) under cfg's routing method, computed from router_logits [M, E] (float32 or bfloat16; float64
    for gradient checks), differentiable with respect to router_logits.

    cfg: a MoeConfig, or its routing_spec(cfg): with a spec the call compiles with
    torch.compile(fullgraph=True) (the weights are one registered op, torch.ops.moekit.replay_weights,
    with the gradient of docs/routing.md section 6 registered beside it).

    score_bias [E] (deepseek_v3) only enters selection, never a weight: it changes nothing here but is
    accepted so a call can mirror the layer's. Forced ids are checked (range, -1, duplicates; ValueError
    naming the first bad one): host ids by the kernel's own check, device ids on the host after a copy (a
    synchronization; check_ids=False skips it for ids already validated, e.g. read from a checked capture).
    int64 host ids are range-checked before they are narrowed to the kernel's int32. Under torch.compile
    the host-side checks, which depend on the values, are left to the kernel (host ids) or skipped."""
    router_logits = tensor_arg("router_logits", router_logits, optional=False)
    forced_ids = tensor_arg("forced_ids", forced_ids, optional=False)
    score_bias = tensor_arg("score_bias", score_bias)
    if not isinstance(cfg, RoutingSpec) and torch.compiler.is_compiling():
        # The config is a native object torch.compile cannot look into; its spec is plain values.
        raise TypeError("replay_routing under torch.compile: pass moekit.torch.routing_spec(cfg), made once "
                        "outside the compiled code, instead of the MoeConfig")
    spec = cfg if isinstance(cfg, RoutingSpec) else routing_spec(cfg)
    if router_logits.dim() != 2 or router_logits.shape[1] != spec.num_experts:
        raise ValueError(f"router_logits: expected [M, {spec.num_experts}], got {list(router_logits.shape)}")
    if forced_ids.shape != (router_logits.shape[0], spec.top_k):
        raise ValueError(f"forced_ids: expected [{router_logits.shape[0]}, {spec.top_k}], got {list(forced_ids.shape)}")
    if forced_ids.dtype not in (torch.int16, torch.int32, torch.int64):
        raise ValueError(f"forced_ids: expected an integer dtype, got {forced_ids.dtype}")
    if spec.method == "custom":
        raise ValueError("replay_routing: custom routing has no weight formula to replay")
    if score_bias is not None and spec.method != "deepseek_v3":
        raise ValueError("score_bias: only deepseek_v3 has a selection bias")
    f64 = router_logits.dtype == torch.float64
    if not torch.compiler.is_compiling():
        if f64 or (check_ids and router_logits.device.type != "cpu"):
            _check_ids_host(forced_ids, spec.num_experts)  # host ids on the kernel path are checked by the kernel
            if not torch.isfinite(router_logits).all():
                raise ValueError("router_logits: router logits must be finite")
        elif forced_ids.dtype == torch.int64 and forced_ids.device.type == "cpu":
            # The kernel checks the int32 ids it is given; narrowing first would wrap 2**32 + 3 into expert 3.
            _check_ids_host(forced_ids, spec.num_experts)
    if f64:
        return _ReplayRoutingF64.apply(router_logits, forced_ids, spec)
    return torch.ops.moekit.replay_weights(router_logits, forced_ids, score_bias, spec.config)


def _check_ids_host(ids: torch.Tensor, num_experts: int) -> None:
    ids = ids.detach().cpu().long()
    bad = (ids < 0) | (ids >= num_experts)
    if bad.any():
        r, j = bad.nonzero()[0].tolist()
        raise ValueError(f"forced_ids[{r}, {j}] = {int(ids[r, j])} outside [0, {num_experts})")
    srt = ids.sort(dim=1).values
    dup = srt[:, 1:] == srt[:, :-1]
    if dup.any():
        r = int(dup.nonzero()[0, 0])
        raise ValueError(f"forced_ids row {r} repeats an expert: {ids[r].tolist()}")


__all__ = ["replay_routing", "routing_spec", "RoutingSpec"]


def _activation(z: torch.Tensor, kind: str, intermediate: int, swiglu_limit: float,
                swiglu_alpha: float) -> torch.Tensor:
    """The layer's activations (config.h) on GEMM1's output z [n, N1], in plain torch."""
    if kind == "silu":
        return torch.nn.functional.silu(z[:, :intermediate]) * z[:, intermediate:]
    if kind == "gelu":  # the tanh form, as the kernels
        return torch.nn.functional.gelu(z[:, :intermediate], approximate="tanh") * z[:, intermediate:]
    if kind == "swiglu_oai":  # gate 2i, up 2i + 1
        g = z[:, 0::2].clamp(max=swiglu_limit)
        u = z[:, 1::2].clamp(min=-swiglu_limit, max=swiglu_limit)
        return g * torch.sigmoid(swiglu_alpha * g) * (u + 1)
    if kind == "relu2":
        return torch.relu(z).square()
    raise ValueError(f"activation: expected silu, gelu, swiglu_oai or relu2, got {kind!r}")


def forced_experts(hidden: torch.Tensor, forced_ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
                   w2: torch.Tensor, activation: str = "silu", swiglu_limit: float = 7.0,
                   swiglu_alpha: float = 1.702) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * W2[e] act(W13[e] hidden[t]), e = forced_ids[t, j]: the routed experts of a
    forced routing in plain torch, differentiable in hidden, weights, w13 and w2. Layouts as the layer's
    (w13 [E, N1, H] with gate/up halves, swiglu_oai's interleaved; w2 [E, H, I]). Computed per expert in
    float32 (float64 when an input is float64), returned in that dtype."""
    for name, t in (("hidden", hidden), ("forced_ids", forced_ids), ("weights", weights), ("w13", w13), ("w2", w2)):
        tensor_arg(name, t, optional=False)
    if hidden.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or w13.shape[2] != hidden.shape[1] or \
            w2.shape[0] != w13.shape[0] or w2.shape[1] != hidden.shape[1]:
        raise ValueError(f"forced_experts: expected hidden [M, H], w13 [E, N1, H], w2 [E, H, I]; got "
                         f"{list(hidden.shape)}, {list(w13.shape)}, {list(w2.shape)}")
    if forced_ids.shape != weights.shape or forced_ids.dim() != 2 or forced_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"forced_experts: forced_ids and weights must both be [M, k] with M = {hidden.shape[0]}; "
                         f"got {list(forced_ids.shape)} and {list(weights.shape)}")
    E, intermediate = w13.shape[0], w2.shape[2]
    if w13.shape[1] != (intermediate if activation == "relu2" else 2 * intermediate):
        raise ValueError(f"forced_experts: w13 has {w13.shape[1]} rows for I = {intermediate} and {activation}")
    ids = forced_ids.long().reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= E):
        raise ValueError(f"forced_experts: ids must lie in [0, {E})")
    dtype = torch.float64 if torch.float64 in (hidden.dtype, weights.dtype, w13.dtype, w2.dtype) else torch.float32
    k = forced_ids.shape[1]
    tokens = torch.arange(hidden.shape[0], device=hidden.device).repeat_interleave(k)
    slot_w = weights.reshape(-1).to(dtype)
    out = torch.zeros((hidden.shape[0], hidden.shape[1]), dtype=dtype, device=hidden.device)
    for e in ids.unique().tolist():
        pick = (ids == e).nonzero().squeeze(1)
        tok = tokens[pick]
        z = hidden[tok].to(dtype) @ w13[e].to(dtype).t()
        y = _activation(z, activation, intermediate, swiglu_limit, swiglu_alpha) @ w2[e].to(dtype).t()
        out = out.index_add(0, tok, y * slot_w[pick, None])
    return out


class _StraightThrough(torch.autograd.Function):
    """value in the forward, the gradient into reference in the backward."""

    @staticmethod
    def forward(ctx, value, reference):
        ctx.reference_dtype = reference.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        return None, g.to(ctx.reference_dtype)


def replayed_moe(layer, hidden: torch.Tensor, router_logits: torch.Tensor, forced_ids: torch.Tensor, experts,
                 score_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A MoE layer of a training forward that replays a rollout's experts.

    Value: layer(hidden, router_logits, forced_ids=forced_ids), the moekit layer's own output (bit for bit
    the engine's for the same ids and batch-invariant layers), in the layer's dtype. Gradients: those of
    experts(hidden, forced_ids, weights) with weights = replay_routing(router_logits, forced_ids, ...),
    i.e. of the same forced routing evaluated in torch: to hidden, to the router (through the logits) and
    to whatever `experts` reads (forced_experts on the model's own weight parameters, or the model's own
    expert modules). The two agree in value to the layer's accuracy (docs/r3.md); the gradient is the
    torch model's, exactly.

    experts: callable (hidden, forced_ids, weights) -> [M, H], e.g.
      functools.partial(moekit.torch.forced_experts, w13=w13, w2=w2, activation="silu").
    score_bias: as replay_routing's (deepseek_v3: selection only, never a weight)."""
    if not callable(experts):
        raise TypeError(f"experts: expected a callable (hidden, forced_ids, weights) -> [M, H], got "
                        f"{type(experts).__qualname__}")
    weights = replay_routing(router_logits, forced_ids, layer.config, score_bias=score_bias)
    reference = experts(hidden, forced_ids, weights)
    with torch.no_grad():
        ids32 = forced_ids if forced_ids.dtype == torch.int32 else forced_ids.to(torch.int32)  # range-checked above
        value = layer(hidden.detach(), router_logits.detach(), forced_ids=ids32)
    if reference.shape != value.shape:
        raise ValueError(f"experts returned {list(reference.shape)}, the layer {list(value.shape)}")
    return _StraightThrough.apply(value, reference)
