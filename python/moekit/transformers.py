"""moekit inside a transformers model: patch() swaps every sparse-MoE block of a
loaded model for moekit.nn.MoE in place, unpatch() puts the blocks back.

transformers stays an optional dependency: only this module and moekit.nn's users
need it, and this module does not import it (it works on the model it is given).
"""
import inspect
import json
from typing import Dict, List

import torch

from . import _moekit
from ._moekit import MoeConfig
from ._torch import flag
from .layer import MoeLayer, route, select_backend
from .r3.format import routing_dict
from .routes import Routes
from .nn import MODEL_TYPES, TRAIN_PATHS, MoE, in_spec_order, is_moe_block, looks_like_moe_block, router_of
from .torch import replay_routing, routing_spec


# MoE's keyword options and their types, read from its signature.
_LAYER_OPTIONS = {n: type(p.default) for n, p in inspect.signature(MoE.__init__).parameters.items()
                  if p.default is not inspect.Parameter.empty}


def _check_layer_options(options: dict) -> None:
    """The options every patched layer gets (MoE's): checked once, so that a refusal
    inside the loop is about the layer, not about the options."""
    for name, value in options.items():
        kind = _LAYER_OPTIONS.get(name)
        if kind is None:
            raise TypeError(f"patch: unknown layer option {name!r} (options: {', '.join(_LAYER_OPTIONS)})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"patch: {name} must be {kind.__name__}, got {value!r}")
    if options.get("max_num_tokens", 1) <= 0:
        raise ValueError(f"patch: max_num_tokens must be > 0, got {options['max_num_tokens']}")
    if options.get("train_path", TRAIN_PATHS[0]) not in TRAIN_PATHS:
        raise ValueError(f"patch: train_path must be one of {', '.join(TRAIN_PATHS)}, got {options['train_path']!r}")


def _check_backend(options: dict, device: torch.device) -> None:
    """What every block would be refused for alike, refused once: a backend name moekit does not run on
    the model's device, or a bad MOEKIT_* variable (read when a config or a layer is made)."""
    try:
        cfg = MoeConfig(num_experts=2, top_k=1, hidden_size=128, intermediate_size=128,
                        batch_invariant=options.get("batch_invariant", False), capture=options.get("capture", True))
        names = sorted({r["backend"] for r in select_backend(cfg, device.type)})
        if device.type == "cpu":  # the thread-count variable is read by a CPU layer
            MoeLayer(cfg, torch.zeros(2, 256, 128, dtype=torch.bfloat16), torch.zeros(2, 128, 128, dtype=torch.bfloat16))
    except ValueError as e:
        raise ValueError(f"patch: {e}") from None
    backend = options.get("backend", "auto")
    if backend != "auto" and backend not in names:
        raise ValueError(f"patch: backend {backend!r} is not one moekit runs on {device.type} here "
                         f"(available: {', '.join(names)}; or 'auto')")


# Where other families keep a decoder layer's MLP block (Llama4, GraniteMoE, Mixtral before transformers 5).
_OTHER_BLOCK_ATTRS = ("feed_forward", "block_sparse_moe")


def _decoder_layers(model: torch.nn.Module):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"model: {type(model).__name__} has no decoder layers (model.model.layers)")
    return layers


def patch(model: torch.nn.Module, strict: bool = False, share_workspace: bool = True,
          **layer_options) -> Dict[str, List[dict]]:
    """Swaps the sparse-MoE block (`mlp`) of every decoder layer for a moekit.nn.MoE
    built from it (layer_options: MoE's, e.g. max_num_tokens, backend,
    batch_invariant). Returns {"patched": [{layer, block, backend, kernel}],
    "left": [{layer, block, reason}]}: what was swapped and what was left and why.
    A block moekit cannot run here (no backend serves it, e.g. f32 weights on the
    GPU backend, or a weight dtype the loader does not take) stays transformers'
    and is listed with moekit's reason; strict=True raises that ValueError instead.
    share_workspace: the patched layers run one at a time (a model's forward), so
    those on one device share one kernel workspace, the largest (a refit keeps it);
    False for a model whose layers run concurrently (other streams or threads)."""
    strict, share_workspace = flag("strict", strict), flag("share_workspace", share_workspace)
    _check_layer_options(layer_options)
    report = {"patched": [], "left": []}
    layers = _decoder_layers(model)
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model: {type(model).__name__} has no config (the transformers config says the routing)")
    weights = next(iter(model.parameters()), None)
    _check_backend(layer_options, weights.device if weights is not None else torch.device("cpu"))
    for i, layer in enumerate(layers):
        block = getattr(layer, "mlp", None)
        other = next((getattr(layer, a) for a in _OTHER_BLOCK_ATTRS if hasattr(layer, a)), None)
        name = type(block if block is not None else other).__name__
        if isinstance(block, MoE):
            report["left"].append({"layer": i, "block": name, "reason": "already patched"})
        elif block is None or not is_moe_block(block):
            found = block if block is not None else other
            reason = (f"an MoE block of a family moekit does not run ({config.model_type}; moekit runs "
                      f"{', '.join(MODEL_TYPES)})" if found is not None and looks_like_moe_block(found)
                      else "not a sparse-MoE block (a dense MLP)" if found is not None
                      else f"no MLP block ({type(layer).__name__} has none of mlp, {', '.join(_OTHER_BLOCK_ATTRS)})")
            report["left"].append({"layer": i, "block": name, "reason": reason})
        else:
            try:
                moe = MoE(block, config, i, **layer_options)
            except ValueError as e:
                if strict:
                    raise
                report["left"].append({"layer": i, "block": name, "reason": str(e)})
                continue
            layer.mlp = moe
            report["patched"].append({"layer": i, "block": name, "backend": moe.layer.backend,
                                      "kernel": moe.layer.kernel})
    if share_workspace:
        _share_workspace([layers[p["layer"]].mlp for p in report["patched"]])
    return report


def _share_workspace(moes: List[MoE]) -> None:
    """The layers as one native Model, whose add_layer shares a workspace per device (the
    largest); the buffers stay with the layers after the Model is gone."""
    model = _moekit.Model(True)
    for moe in moes:
        model.add_layer(moe.layer._layer, moe.layer_index)


def unpatch(model: torch.nn.Module) -> int:
    """Puts every patched layer's transformers block back; returns how many."""
    restored = 0
    for layer in _decoder_layers(model):
        block = getattr(layer, "mlp", None)
        if isinstance(block, MoE):
            block._unwatch_weights()
            layer.mlp = block.block
            restored += 1
    return restored


# --- Routing replay for transformers-based trainers (the trainer side of R3) ---

class _Block:
    """One MoE layer of a model, patched or not: its router module, routing config and selection bias."""

    def __init__(self, model, index: int, block: torch.nn.Module):
        self.index = index
        self.block = block
        self.moe = block if isinstance(block, MoE) else None
        self.router = router_of(block)
        self.config = (self.moe.layer.config if self.moe is not None else
                       _moekit.checkpoint_layer_config(json.dumps(model.config.to_dict(), default=str), index))
        self.score_bias = getattr(self.router, "e_score_correction_bias", None)
        self.spec = routing_spec(self.config)  # plain values: a replay's weights compile with fullgraph=True


def _blocks(model) -> List[_Block]:
    out = []
    for i, layer in enumerate(_decoder_layers(model)):
        block = getattr(layer, "mlp", None)
        if isinstance(block, MoE) or (block is not None and is_moe_block(block)):
            out.append(_Block(model, i, block))
    if not out:
        raise ValueError(f"model: {type(model).__name__} has no sparse-MoE block moekit knows")
    return out


def _routing_of(config) -> dict:
    return routing_dict(config.routing, config.top_k, config.num_groups, config.topk_groups,
                        config.routed_scaling_factor, config.routing == "deepseek_v3", config.renormalize)


def _forward_inputs(args, kwargs):
    """(input_ids [B, S] or None, the KV cache's length before this forward) of a decoder model's forward."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    # transformers 5.25 renamed the forward's past_key_values to cache (the old name still works there).
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    start = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    return (ids if isinstance(ids, torch.Tensor) else None), int(start)


def _spec_ids(b: _Block, logits: torch.Tensor) -> torch.Tensor:
    bias = None if b.score_bias is None else b.score_bias.detach().float()
    ids, _ = route(logits.detach().float().contiguous(), b.config, score_bias=bias)
    return ids


class capture:
    """with moekit.transformers.capture(model) as routes: model.generate(...)

    Records, for every MoE layer and every forward, the ids the layer runs, in the
    routing spec's order (descending score, the spec's tie rule) wherever they are
    the set the spec selects from the router's logits (always, unless a replay forced
    others, which are kept as forced), with each batch row's token ids. A forward that
    starts a sequence (no KV cache yet) starts new requests, named "0", "1", ... in
    order; a cached forward (generate's decode steps) continues them. The routes are
    complete when the block exits. Works on patched and unpatched models."""

    def __init__(self, model):
        self._blocks = _blocks(model)
        self._inner = getattr(model, "model", model)
        first = self._blocks[0].config
        self.routes = Routes([b.index for b in self._blocks], first.top_k, first.num_experts, _routing_of(first))
        self._hooks = []

    def __enter__(self) -> Routes:
        self._batch = {}  # MoE layer -> [B, S] of its call in flight
        self._groups = []  # per sequence-starting forward: {"tokens": [[B, S] per forward], "ids": per layer [[B, S, k]]}

        def on_forward(module, args, kwargs):
            tokens, start = _forward_inputs(args, kwargs)
            if start == 0 or not self._groups:
                self._groups.append({"tokens": [], "ids": [[] for _ in self._blocks]})
            self._groups[-1]["tokens"].append(None if tokens is None else tokens.detach().to("cpu", torch.int64))

        self._hooks.append(self._inner.register_forward_pre_hook(on_forward, with_kwargs=True))
        for l, b in enumerate(self._blocks):
            def before(module, args, l=l):
                self._batch[l] = args[0].shape[:-1]  # [B, S] of this call

            def after(module, args, out, l=l, b=b):
                batch = self._batch.pop(l, None) or (1, args[0].shape[0])
                ran = out[2].to(torch.int64)  # what the layer runs
                if getattr(module, "_moekit_replaying", False):
                    ids = ran  # forced (and live rows) as the replay gave them
                else:
                    ids, _ = in_spec_order(_spec_ids(b, out[0]).to(torch.int64), ran)
                ids = ids.to(torch.int16).cpu()
                if not self._groups:  # the block called on its own, not through the model
                    self._groups.append({"tokens": [], "ids": [[] for _ in self._blocks]})
                self._groups[-1]["ids"][l].append(ids.reshape(*batch, -1) if len(batch) == 2 else ids[None])

            self._hooks.append(b.block.register_forward_pre_hook(before))
            self._hooks.append(b.router.register_forward_hook(after))
        return self.routes

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if exc[0] is None:
            for group in self._groups:
                self._add_requests(group)

    def _add_requests(self, group) -> None:
        if not group["ids"][0]:
            return
        rows = group["ids"][0][0].shape[0]
        ids = torch.stack([torch.cat(calls, dim=1) for calls in group["ids"]], dim=2)  # [B, T, L, k]
        known = all(t is not None for t in group["tokens"]) and group["tokens"]
        tokens = torch.cat(group["tokens"], dim=1) if known else torch.full((rows, 0), -1, dtype=torch.int64)
        for b in range(rows):
            # Without token ids (a forward of embeddings) the rows cannot be checked: they hold -1 tokens.
            t = tokens[b] if known else torch.full((ids.shape[1],), -1, dtype=torch.int64)
            self.routes.add(str(self.routes.num_requests), ids[b], t)


class replay:
    """with moekit.transformers.replay(model, routes): loss = model(input_ids).loss

    Forces the captured ids in every MoE layer of the forward: batch row b is request b of
    `routes` (routes.select(names) puts them in the batch's order), token t takes the ids
    of its position in the request (a KV-cached forward, e.g. generate's decode steps,
    continues where the cache ends). Before anything is forced, each row's token ids are
    checked against its request's (ValueError naming the row and request, and which
    request they do match); at most live_tail tokens of a row may lie past the request's
    routed tokens (they route live; 1: generate's last token, which no forward computed).
    Under torch.compile the checks are the caller's (routes.check_batch). The weights of the
    forced ids come from the live router logits through moekit.torch.replay_routing, so
    the router gets its gradient; the experts run as the forward would run them
    (transformers' own modules in training, moekit's layer without gradients). Replays
    do not nest (the inner one would change what the outer forces): a second replay of
    the same model raises."""

    def __init__(self, model, routes: Routes, live_tail: int = 1):
        if not isinstance(routes, Routes):
            raise TypeError(f"routes: expected moekit.transformers.Routes, got {type(routes).__module__}."
                            f"{type(routes).__qualname__} (Routes.from_ids / from_capture build one)")
        if not isinstance(live_tail, int) or isinstance(live_tail, bool) or live_tail < 0:
            raise ValueError(f"live_tail must be an integer >= 0, got {live_tail!r}")
        self._blocks = _blocks(model)
        self._inner = getattr(model, "model", model)
        if [b.index for b in self._blocks] != routes.model_layers:
            raise ValueError(f"routes: captured on MoE layers {routes.model_layers}, the model has "
                             f"{[b.index for b in self._blocks]}")
        top_k, num_experts = self._blocks[0].config.top_k, self._blocks[0].config.num_experts
        if (routes.top_k, routes.num_experts) != (top_k, num_experts):
            raise ValueError(f"routes: k={routes.top_k} of E={routes.num_experts} experts, the model routes "
                             f"k={top_k} of E={num_experts}")
        if routes.num_requests == 0:
            raise ValueError("routes: no requests to replay")
        self.routes = routes
        self.live_tail = live_tail
        self._hooks = []

    def _forced(self, l: int, batch, device) -> torch.Tensor:
        """[B*S, k] int64 forced ids of this call for layer l, -1 where nothing was captured."""
        B, S = batch
        if device not in self._tables:
            self._tables[device] = self.routes.batch().to(device=device, dtype=torch.int64)  # [R, T, L, k]
        table = self._tables[device]
        start = self._start
        rows, tokens = min(B, table.shape[0]), max(0, min(S, table.shape[1] - start))
        forced = torch.full((B, S, table.shape[3]), -1, dtype=torch.int64, device=device)
        forced[:rows, :tokens] = table[:rows, start:start + tokens, l]
        return forced.reshape(B * S, -1)

    def __enter__(self) -> "replay":
        if any(getattr(b.router, "_moekit_replaying", False) for b in self._blocks):
            raise ValueError("replay: this model is already under a replay; replays do not nest (exit the "
                             "first, or select() the routes you need into one)")
        self._tables = {}  # the captured ids, one copy per device they are forced on
        self._batch = {}  # MoE layer -> [B, S] of its call in flight (an attribute, which torch.compile traces)
        self._start = 0  # the forward's first position (the KV cache's length)

        def on_forward(module, args, kwargs):
            tokens, self._start = _forward_inputs(args, kwargs)
            if tokens is not None and not torch.compiler.is_compiling():
                self.routes.check_batch(tokens, self._start, self.live_tail)

        self._hooks.append(self._inner.register_forward_pre_hook(on_forward, with_kwargs=True))
        for l, b in enumerate(self._blocks):
            def before(module, args, l=l):
                self._batch[l] = args[0].shape[:-1]  # [B, S] of this call (the router sees [B*S, H])

            def after(module, args, out, l=l, b=b):
                batch = self._batch.pop(l, None) or (1, args[0].shape[0])
                logits, live_w, live_ids = out[0], out[1], out[2]
                forced = self._forced(l, batch if len(batch) == 2 else (1, batch[0]), logits.device)
                rows = (forced >= 0).all(dim=1, keepdim=True)
                ids = torch.where(rows, forced, live_ids.to(torch.int64))
                # Every row through replay_routing (its live rows' ids are valid too), then the live
                # rows' own weights back: no branch on the values, so a compiled model stays one graph.
                forced_w = replay_routing(logits, ids, b.spec, check_ids=False)
                w = torch.where(rows, forced_w.to(live_w.dtype), live_w)
                return logits, w, ids.to(live_ids.dtype)

            self._hooks.append(b.block.register_forward_pre_hook(before))
            # First among the router's hooks: a capture's hook then sees the forced ids.
            self._hooks.append(b.router.register_forward_hook(after, prepend=True))
            b.router._moekit_replaying = True
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for b in self._blocks:
            b.router._moekit_replaying = False
