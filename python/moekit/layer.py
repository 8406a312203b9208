"""MoeLayer, Model, select_backend and route: the Python face of include/moekit/layer.h,
oracle.h and routing.h."""
import weakref
from typing import Dict, List, Optional, Tuple, Union

import torch

from . import _moekit, ops
from ._moekit import MoeConfig
from ._torch import (DeviceLike, flag, no_grad_needed, on_a_real_device, parse_device, stream_of, tensor_arg,
                     to_device, weight)

_LOGITS_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _config_arg(config) -> MoeConfig:
    if not isinstance(config, MoeConfig):
        raise TypeError(f"config: expected a moekit.MoeConfig, got {type(config).__module__}.{type(config).__qualname__}")
    return config


def _fixed_order_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] . weight [N, K]^T (+ bias [N]), float32, each row computed as it is alone, whatever M: a
    GEMM's blocking and kernel follow M (F.linear rounds differently by batch). On the CPU, one product
    per row (the same library call for every row); on a GPU, where a call per row costs a launch, the K
    products zero-padded to a power of two and halves added pairwise: elementwise operations only (each
    correctly rounded), so one order for every element, in pieces of at most 2^24 products (64 MiB)."""
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=torch.float32, device=x.device)
    if x.device.type == "cpu":
        wt = weight.t()
        for r in range(M):
            torch.mm(x[r:r + 1], wt, out=out[r:r + 1])
    else:
        _pairwise_linear(x, weight, out)
    return out if bias is None else out + bias


def _pairwise_linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """out [M, N] = x [M, K] . weight [N, K]^T by elementwise operations in one order (_fixed_order_linear)."""
    M, K = x.shape
    N = weight.shape[0]
    P = 1 << max(0, (K - 1).bit_length())
    xt = torch.nn.functional.pad(x, (0, P - K)).t()  # K first: each halving adds two contiguous blocks
    wt = torch.nn.functional.pad(weight, (0, P - K)).t()
    step = max(1, (1 << 24) // (N * P))
    for s in range(0, M, step):
        v = xt[:, s:s + step, None] * wt[:, None, :]  # [P, m, N]
        while v.shape[0] > 1:
            half = v.shape[0] // 2
            v = v[:half] + v[half:]
        out[s:s + step] = v[0]


class MoeLayer:
    """One MoE layer: the kernel the oracle chose, its prepared weights and workspace.

    w13 [E, 2I, H] and w2 [E, H, I] (host or device tensors; copied or re-laid-out
    once, so the caller may free them). score_bias [E] float32 enables
    deepseek_v3's selection bias. device: where the layer runs (default: w13's device);
    a layer asked for on a CUDA device never falls back to the CPU. Extras, as a model
    folder brings them (the config follows what is given): w13_bias [E, n1] and w2_bias
    [E, H] float32 (gpt-oss), a shared expert shared_w13 [2 Is, H] and shared_w2 [H, Is]
    in the experts' dtype, and its sigmoid gate shared_gate [H] float32 (Qwen2-MoE).

    fp8 schemes (config quant="fp8_block128" | "fp8_per_tensor", docs/fp8.md): w13/w2
    are torch.float8_e4m3fn with float32 scales w13_scale/w2_scale in the layouts of
    MoeWeights (block: [E, P*ceil(I/128), ceil(H/128)] and [E, ceil(H/128), ceil(I/128)];
    per tensor: [E, P] and [E]; P = 2 gated), and a13_scale/a2_scale [E] for static
    activation scales. 4-bit schemes (quant="mxfp4" | "int4_g32" | "int4_g128",
    docs/weights_4bit.md): w13 [E, n1, H/2] and w2 [E, H, I/2] torch.uint8, two values a
    byte (even column in the low nibble), with scales [E, n1, H/g] and [E, H, I/g]
    (uint8 E8M0 exponents for mxfp4, float32 for int4).
    """

    def __init__(self, config: MoeConfig, w13: torch.Tensor, w2: torch.Tensor,
                 score_bias: Optional[torch.Tensor] = None, device: DeviceLike = None,
                 w13_scale: Optional[torch.Tensor] = None, w2_scale: Optional[torch.Tensor] = None,
                 a13_scale: Optional[torch.Tensor] = None, a2_scale: Optional[torch.Tensor] = None,
                 w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                 shared_w13: Optional[torch.Tensor] = None, shared_w2: Optional[torch.Tensor] = None,
                 shared_gate: Optional[torch.Tensor] = None):
        w13, w2 = weight("w13", w13, optional=False), weight("w2", w2, optional=False)
        self.device = to_device(device, default=w13.device)
        self._layer = _moekit.create_layer(config := _config_arg(config), w13, w2, weight("score_bias", score_bias),
                                           self.device.type, self.device.index or 0, weight("w13_scale", w13_scale),
                                           weight("w2_scale", w2_scale), weight("a13_scale", a13_scale),
                                           weight("a2_scale", a2_scale), weight("w13_bias", w13_bias),
                                           weight("w2_bias", w2_bias), weight("shared_w13", shared_w13),
                                           weight("shared_w2", shared_w2), weight("shared_gate", shared_gate))
        # The layer's config: the given one with the extras the tensors brought.
        self.config = self._layer.config
        self._init_from_config(self.config)
        self._score_bias = None if score_bias is None else score_bias.detach().to(self.device, torch.float32)
        self._handle = ops.register(self._layer)
        weakref.finalize(self, ops.unregister, self._handle)

    def update_weights(self, w13: torch.Tensor, w2: torch.Tensor, score_bias: Optional[torch.Tensor] = None,
                       **extras: Optional[torch.Tensor]) -> None:
        """New values of the weights the layer was made with (same shapes, dtypes and extras: the
        constructor's keyword tensors), e.g. after an optimizer step: prepared in place, after the
        forwards in flight, so the layer's buffers (and a CUDA graph captured over it) stay valid.
        After an error the layer refuses to run until an update succeeds."""
        names = ("w13_scale", "w2_scale", "a13_scale", "a2_scale", "w13_bias", "w2_bias", "shared_w13", "shared_w2",
                 "shared_gate")
        unknown = sorted(set(extras) - set(names))
        if unknown:
            raise TypeError(f"update_weights: unknown tensor(s) {', '.join(unknown)} (known: {', '.join(names)})")
        self._layer.update_weights(weight("w13", w13, optional=False), weight("w2", w2, optional=False),
                                   weight("score_bias", score_bias), **{n: weight(n, extras.get(n)) for n in names})
        if score_bias is not None and self._score_bias is not None:
            self._score_bias.copy_(score_bias.detach())

    def update_score_bias(self, score_bias: torch.Tensor) -> None:
        """A new deepseek_v3 selection bias [E] (float32) alone, copied in place (the expert weights stay)."""
        score_bias = weight("score_bias", score_bias, optional=False)
        if self._score_bias is None:
            raise ValueError("update_score_bias: this layer was made without a selection bias")
        self._layer.update_score_bias(score_bias)
        self._score_bias.copy_(score_bias)

    def _init_from_config(self, config: MoeConfig) -> None:
        # Python values: torch.compile traces __call__, not the C++ config.
        self._top_k = config.top_k
        self._logits_dtype = _LOGITS_DTYPES[config.logits_dtype]
        self._batch_invariant = bool(config.batch_invariant)

    router_weight: Optional[torch.Tensor] = None  # [E, H] float32 (from_pretrained)
    router_bias: Optional[torch.Tensor] = None    # [E] float32 (from_pretrained, gpt-oss)

    @classmethod
    def from_pretrained(cls, model_dir, layer: int, device: DeviceLike = None, max_num_tokens: int = 4096,
                        backend: str = "auto", batch_invariant: bool = False, capture: bool = True,
                        keep_packed_weights: bool = False) -> "MoeLayer":
        """Model layer `layer` of a folder as transformers' save_pretrained writes it
        (config.json + safetensors shards): its config, routing, expert biases and
        shared experts as the config says, bf16/f32, fp8 or 4-bit (docs/layer_files.md,
        docs/weights_4bit.md). Called without router_logits, the layer computes them
        from the checkpoint's router (router_logits()). device: where it runs (default:
        the CPU); backend, batch_invariant and capture as MoeConfig's.
        keep_packed_weights: gpt-oss's MXFP4 experts as stored (quant "mxfp4") rather
        than dequantized to bf16; compressed-tensors INT4 experts are always packed."""
        device = to_device(device, default=torch.device("cpu"))
        return cls._of_checkpoint(device, _moekit.load_checkpoint_layer(
            str(model_dir), layer, max_num_tokens, device.type, device.index or 0, backend,
            flag("batch_invariant", batch_invariant), flag("capture", capture),
            flag("keep_packed_weights", keep_packed_weights)))

    @classmethod
    def _of_checkpoint(cls, device: torch.device, loaded) -> "MoeLayer":
        """A layer from what the checkpoint loader returned: (native, config, router weight, router bias,
        summary, selection bias)."""
        native, config, router_weight, router_bias, summary, score_bias = loaded
        self = cls.__new__(cls)
        self.device = device
        self.config = config
        self._init_from_config(config)
        self._layer = native
        self.summary = summary
        self.router_weight = None if router_weight is None else router_weight.to(self.device)
        self.router_bias = None if router_bias is None else router_bias.to(self.device)
        self._score_bias = None if score_bias is None else score_bias.to(self.device)
        self._handle = ops.register(self._layer)
        weakref.finalize(self, ops.unregister, self._handle)
        return self

    def _refitted(self, loaded) -> None:
        """What an in-place refit returned (the native layer updated its own weights): the router
        tensors take the new values in place too."""
        _, _, router_weight, router_bias, summary, score_bias = loaded
        for name, new in (("router_weight", router_weight), ("router_bias", router_bias), ("_score_bias", score_bias)):
            old = getattr(self, name)
            if old is not None and new is not None and old.shape == new.shape:
                old.copy_(new)
            else:
                setattr(self, name, None if new is None else new.to(self.device))
        self.summary = summary

    def _live_rows_filled(self, forced: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """Rows of -1 route live: they get the ids the routing spec selects from their logits (with the
        selection bias), so the one forward forces the others. A row only partly -1 is an error."""
        unset = forced < 0
        live = unset.all(dim=1)
        if bool((unset.any(dim=1) & ~live).any()):
            r = int((unset.any(dim=1) & ~live).nonzero()[0, 0])
            raise ValueError(f"forced_ids row {r} is partly -1 ({forced[r].tolist()}): a row is forced whole, "
                             "or all -1 to route live")
        rows = live.nonzero()[:, 0]
        ids, _ = route(router_logits[rows.to(router_logits.device)].contiguous(), self.config,
                       score_bias=self._score_bias)
        filled = forced.to(torch.int32).clone()
        filled[rows] = ids.to("cpu")
        return filled

    def _narrowed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 host ids (as torch indexes them) -> int32, range-checked before narrowing (an id of
        2**32 + 3 must not replay as expert 3); the layer's own check then sees every other rule."""
        if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= self.config.num_experts):
            bad = ids[(ids < -1) | (ids >= self.config.num_experts)][0]
            raise ValueError(f"forced_ids: {int(bad)} is not an expert id in [0, {self.config.num_experts})")
        return ids.to(torch.int32)

    def router_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, E] float32 = hidden . router_weight^T (+ router_bias), from the checkpoint's router.
        A batch-invariant layer computes it in one fixed order whatever M (_fixed_order_linear)."""
        if self.router_weight is None:
            raise ValueError("router_logits: this layer has no router weights (give router_logits)")
        if self._batch_invariant:
            return _fixed_order_linear(hidden.float(), self.router_weight, self.router_bias)
        return torch.nn.functional.linear(hidden.float(), self.router_weight, self.router_bias)

    @property
    def backend(self) -> str:
        return self._layer.backend

    @property
    def kernel(self) -> str:
        return self._layer.kernel

    @property
    def monolithic(self) -> bool:
        return self._layer.monolithic

    @property
    def selection_report(self) -> List[Dict[str, str]]:
        """Every candidate the oracle considered: {backend, kernel, kind, verdict, reason}."""
        return self._layer.selection_report

    @property
    def workspace_bytes(self) -> int:
        return self._layer.workspace_bytes

    @property
    def report(self) -> str:
        """Printable: every candidate the oracle considered and why, what it resolved, and the GEMM paths the
        kernel takes at several M and why."""
        return self._layer.report

    def gemm_plan(self, num_tokens: int) -> str:
        """The GEMM paths a forward of num_tokens tokens takes, and why (MoeConfig(kernel=...) forces them)."""
        return self._layer.gemm_plan(int(num_tokens))

    def __call__(self, hidden: torch.Tensor, router_logits: Optional[torch.Tensor] = None, return_ids: bool = False,
                 forced_ids: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                 topk_ids: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None,
                 routing_replay_out: Optional[torch.Tensor] = None
                 ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """out [M, H] = the MoE layer of hidden [M, H] routed by router_logits [M, E].

        return_ids: also return the selected ids [M, k] int32 (logical, spec order).
        forced_ids [M, k] int32 or int64: replay; these experts are used and the routing method
        computes their weights from the live logits; a row of -1 routes live (checked on the host, so device ids
        are copied there: a synchronization; capture a CUDA graph without them).
        out: written in place (every element) and returned.
        topk_ids/topk_weights: custom routing only (router_logits is None then).
        routing_replay_out: an engine's capture target, int16 [>= M, k] on the layer's device (contiguous
        rows): its first M rows receive the ids this forward ran (logical, spec order; forced ids as
        forced), written by the kernel itself, monolithic or modular (docs/capture.md). Rows past M are
        left as they are.
        """
        hidden = tensor_arg("hidden", hidden, optional=False)
        if hidden.is_meta:  # no memory to read; DLPack cannot export it (is_meta: cheaper than .device)
            on_a_real_device("hidden", hidden)
        router_logits = tensor_arg("router_logits", router_logits)
        forced_ids, out = tensor_arg("forced_ids", forced_ids), tensor_arg("out", out)
        topk_ids, topk_weights = tensor_arg("topk_ids", topk_ids), tensor_arg("topk_weights", topk_weights)
        # No backward: every tensor an output's gradient would flow through (or into) is refused.
        no_grad_needed("hidden", hidden)
        no_grad_needed("router_logits", router_logits)
        no_grad_needed("topk_weights", topk_weights)
        no_grad_needed("out", out)
        if router_logits is None and topk_ids is None and self.router_weight is not None:
            router_logits = self.router_logits(hidden)
        if router_logits is not None and router_logits.dtype != self._logits_dtype:
            router_logits = self._logits_as_configured(router_logits)
        if out is None:
            out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
        rows = hidden.shape[0] if hidden.dim() == 2 else 1
        ids = self._ids_target(tensor_arg("routing_replay_out", routing_replay_out), rows)
        if return_ids and ids is None:
            ids = torch.empty((rows, self._top_k), dtype=torch.int16, device=hidden.device)
        if forced_ids is not None and forced_ids.device.type != "cpu":
            forced_ids = forced_ids.to("cpu")
        if forced_ids is not None and forced_ids.dtype == torch.int64:
            forced_ids = self._narrowed_ids(forced_ids)
        if (forced_ids is not None and router_logits is not None and not torch.compiler.is_compiling()
                and forced_ids.numel() and bool((forced_ids < 0).any())):
            forced_ids = self._live_rows_filled(forced_ids, router_logits)
        if torch.compiler.is_compiling():
            torch.ops.moekit.moe_forward(self._handle, hidden, router_logits, out, ids, forced_ids, topk_ids,
                                         topk_weights)
        else:  # eager: the same C++ call without the dispatcher's cost
            ops.forward(self._layer, hidden, router_logits, out, ids, forced_ids, topk_ids, topk_weights)
        if return_ids:
            return out, ids.to(torch.int32)
        return out

    def _ids_target(self, target: Optional[torch.Tensor], rows: int) -> Optional[torch.Tensor]:
        """The first `rows` rows of an int16 [>= rows, k] capture target (a view; the library checks the rest)."""
        if target is None:
            return None
        if target.dim() != 2 or target.shape[0] < rows or target.shape[1] != self._top_k:
            raise ValueError(f"routing_replay_out: expected int16 [>= {rows}, {self._top_k}], got "
                             f"{target.dtype} {list(target.shape)}")
        return target[:rows]

    def _logits_as_configured(self, logits: torch.Tensor) -> torch.Tensor:
        """Router logits of another float dtype than the config's logits_dtype: the routing spec computes
        in f32 either way, so bf16/f16 logits are widened exactly for an f32 layer. Narrowing f32 logits
        for a bf16 layer would round them (other experts, other weights): refused, naming the setting.
        Other dtypes go on to the library, which names what it supports."""
        if self._logits_dtype == torch.float32 and logits.dtype in (torch.bfloat16, torch.float16):
            return logits.float()
        if self._logits_dtype == torch.bfloat16 and logits.dtype in (torch.float32, torch.float16):
            raise ValueError(f"router_logits: {logits.dtype}, but this layer was built with "
                             "MoeConfig(logits_dtype='bf16'); rounding them to bfloat16 would change the routing: "
                             "pass bfloat16 logits, or build the layer with logits_dtype='f32'")
        return logits

    def __repr__(self) -> str:
        return f"MoeLayer({self.backend}/{self.kernel} on {self.device}, {self.config!r})"


class Model:
    """The MoE layers of one model in order, each with its index among all the model's layers.

    The layers run one at a time on one stream, so they share one kernel workspace per
    device, sized for the largest (workspace_bytes: what the model holds); a layer that
    has already run keeps its own. Layers of a Model that run concurrently (other
    streams or threads) need share_workspace=False."""

    def __init__(self, layers: Optional[List[Tuple[MoeLayer, int]]] = None, share_workspace: bool = True):
        self._model = _moekit.Model(flag("share_workspace", share_workspace))
        self.layers: List[MoeLayer] = []
        for layer, index in layers or []:
            self.add_layer(layer, index)

    def add_layer(self, layer: MoeLayer, model_layer_index: int) -> None:
        if not isinstance(layer, MoeLayer):
            raise TypeError(f"layer: expected a moekit.MoeLayer, got {type(layer).__module__}.{type(layer).__qualname__}")
        self._model.add_layer(layer._layer, model_layer_index)
        self.layers.append(layer)

    @property
    def num_layers(self) -> int:
        return self._model.num_layers

    @property
    def model_layer_indices(self) -> List[int]:
        return self._model.model_layer_indices

    @property
    def workspace_bytes(self) -> int:
        return self._model.workspace_bytes


def select_backend(config: MoeConfig, device: DeviceLike = "cuda") -> List[Dict[str, str]]:
    """The oracle's report for `config` among the backends that run on `device`:
    every candidate with {backend, kernel, kind, verdict, reason}. Raises ValueError,
    listing every rejection, when none can serve it."""
    return _moekit.select_backend(config, parse_device(device).type)


def route(router_logits: torch.Tensor, config: MoeConfig, score_bias: Optional[torch.Tensor] = None,
          forced_ids: Optional[torch.Tensor] = None, return_counts: bool = False):
    """The routing spec on the logits' device: (ids [M, k] int32, weights [M, k] float32),
    plus tokens per expert [E] int32 when return_counts. forced_ids [M, k] int32 (same
    device as the logits): replay, the weights of those ids. There is no backward: logits
    that require grad are refused (moekit.torch.replay_routing differentiates the weights)."""
    config = _config_arg(config)
    router_logits = tensor_arg("router_logits", router_logits, optional=False)
    forced_ids = tensor_arg("forced_ids", forced_ids)
    score_bias = weight("score_bias", score_bias)  # enters selection only: no gradient to keep
    if router_logits.requires_grad and torch.is_grad_enabled():
        raise ValueError("router_logits: requires grad, but moekit.route has no backward pass; use "
                         "moekit.torch.replay_routing for weights with gradients, or pass router_logits.detach()")
    rows = router_logits.shape[0] if router_logits.dim() == 2 else 1
    k = config.top_k
    ids = torch.empty((rows, k), dtype=torch.int32, device=router_logits.device)
    weights = torch.empty((rows, k), dtype=torch.float32, device=router_logits.device)
    counts = torch.empty((config.num_experts,), dtype=torch.int32, device=router_logits.device) if return_counts else None
    _moekit.route(config, router_logits, score_bias, forced_ids, ids, weights, counts,
                  stream_of(router_logits.device))
    return (ids, weights, counts) if return_counts else (ids, weights)
