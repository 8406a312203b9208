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
from .layer import route
from .nn import TRAIN_PATHS, MoE, in_spec_order, is_moe_block, router_of
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
    _check_layer_options(layer_options)
    report = {"patched": [], "left": []}
    layers = _decoder_layers(model)
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model: {type(model).__name__} has no config (the transformers config says the routing)")
    for i, layer in enumerate(layers):
        block = getattr(layer, "mlp", None)
        name = type(block).__name__
        if isinstance(block, MoE):
            report["left"].append({"layer": i, "block": name, "reason": "already patched"})
        elif block is None or not is_moe_block(block):
            report["left"].append({"layer": i, "block": name, "reason": "not a sparse-MoE block (a dense MLP)"})
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


class Routes:
    """What capture() recorded: per request (batch row), [tokens, moe_layers, k] int16
    logical ids in the routing spec's order, for every token the model computed
    (prompt and generated; pad tokens included, as they were computed), and the
    MoE-layer -> model-layer map. A token the model never computed (generate's last
    one) has no row; replay() routes such rows live."""

    def __init__(self, model_layers: List[int], top_k: int, num_experts: int):
        self.model_layers = list(model_layers)
        self.top_k = top_k
        self.num_experts = num_experts
        self._steps: List[List[torch.Tensor]] = [[] for _ in model_layers]  # per layer: [B, S, k] per call

    @property
    def num_requests(self) -> int:
        return self._steps[0][0].shape[0] if self._steps[0] else 0

    def ids(self, request: int) -> torch.Tensor:
        """[tokens, moe_layers, k] int16 of batch row `request`."""
        per_layer = [torch.cat([s[request] for s in steps], dim=0) for steps in self._steps]
        return torch.stack(per_layer, dim=1)

    def batch(self) -> torch.Tensor:
        """[requests, tokens, moe_layers, k] int16: every row's ids (rows of one batch share their length)."""
        return torch.stack([self.ids(r) for r in range(self.num_requests)])


def _spec_ids(b: _Block, logits: torch.Tensor) -> torch.Tensor:
    bias = None if b.score_bias is None else b.score_bias.detach().float()
    ids, _ = route(logits.detach().float().contiguous(), b.config, score_bias=bias)
    return ids


class capture:
    """with moekit.transformers.capture(model) as routes: model.generate(...)

    Records, for every MoE layer and every forward, the ids the layer runs, in the
    routing spec's order (descending score, the spec's tie rule) wherever they are
    the set the spec selects from the router's logits (always, unless a replay forced
    others, which are kept as forced). Works on patched and unpatched models; hooks
    are removed on exit."""

    def __init__(self, model):
        self._blocks = _blocks(model)
        self.routes = Routes([b.index for b in self._blocks], self._blocks[0].config.top_k,
                             self._blocks[0].config.num_experts)
        self._hooks = []

    def __enter__(self) -> Routes:
        self._batch = {}  # MoE layer -> [B, S] of its call in flight
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
                self.routes._steps[l].append(ids.reshape(*batch, -1) if len(batch) == 2 else ids[None])

            self._hooks.append(b.block.register_forward_pre_hook(before))
            self._hooks.append(b.router.register_forward_hook(after))
        return self.routes

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


class replay:
    """with moekit.transformers.replay(model, routes): loss = model(input_ids).loss

    Forces the captured ids in every MoE layer of the forward (input [B, T]: row b
    takes routes.ids(b)'s first T tokens; tokens past what was captured route live).
    The weights of the forced ids come from the live router logits through
    moekit.torch.replay_routing, so the router gets its gradient; the experts run as
    the forward would run them (transformers' own modules in training, moekit's layer
    without gradients), so their gradients are transformers' own."""

    def __init__(self, model, routes: Routes):
        self._blocks = _blocks(model)
        if [b.index for b in self._blocks] != routes.model_layers:
            raise ValueError(f"routes: captured on MoE layers {routes.model_layers}, the model has "
                             f"{[b.index for b in self._blocks]}")
        self.routes = routes
        self._hooks = []

    def _forced(self, l: int, batch, device) -> torch.Tensor:
        """[B*S, k] int64 forced ids of this call for layer l, -1 where nothing was captured."""
        B, S = batch
        if device not in self._tables:
            self._tables[device] = self.routes.batch().to(device=device, dtype=torch.int64)  # [R, T, L, k]
        table = self._tables[device]
        rows, tokens = min(B, table.shape[0]), min(S, table.shape[1])
        forced = torch.full((B, S, table.shape[3]), -1, dtype=torch.int64, device=device)
        forced[:rows, :tokens] = table[:rows, :tokens, l]
        return forced.reshape(B * S, -1)

    def __enter__(self) -> "replay":
        self._tables = {}  # the captured ids, one copy per device they are forced on
        self._batch = {}  # MoE layer -> [B, S] of its call in flight (an attribute, which torch.compile traces)
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
