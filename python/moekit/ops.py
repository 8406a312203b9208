"""torch.ops.moekit.moe_forward: the layer forward as one registered torch op.

The op writes `out` (and `routing_replay_out` when given) in place and returns
nothing; its fake implementation does nothing, so torch.compile sees one opaque
node with declared mutations, and a CUDA graph records the kernels it enqueues
on torch's current stream. Layers are passed by an integer handle, because a
torch op takes tensors and scalars only.
"""
import itertools
from typing import Dict, Optional

import torch

from . import _moekit
from ._torch import stream_of

_layers: Dict[int, "_moekit.Layer"] = {}
_next_handle = itertools.count(1)


def register(layer: "_moekit.Layer") -> int:
    handle = next(_next_handle)
    _layers[handle] = layer
    return handle


def unregister(handle: int) -> None:
    _layers.pop(handle, None)


def layer_of(handle: int) -> "_moekit.Layer":
    try:
        return _layers[handle]
    except KeyError:
        raise ValueError(f"moekit layer handle {handle} is unknown (the layer was deleted)") from None


def forward(layer: "_moekit.Layer", hidden, router_logits, out, routing_replay_out, forced_ids, topk_ids,
            topk_weights) -> None:
    """The direct call: what the op runs, and what an eager MoeLayer call runs without the dispatcher."""
    layer.forward(hidden, router_logits, out, routing_replay_out, forced_ids, topk_ids, topk_weights,
                  stream_of(hidden.device))


@torch.library.custom_op("moekit::moe_forward", mutates_args=("out", "routing_replay_out"))
def moe_forward(layer: int, hidden: torch.Tensor, router_logits: Optional[torch.Tensor], out: torch.Tensor,
                routing_replay_out: Optional[torch.Tensor], forced_ids: Optional[torch.Tensor],
                topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor]) -> None:
    forward(layer_of(layer), hidden, router_logits, out, routing_replay_out, forced_ids, topk_ids, topk_weights)


@moe_forward.register_fake
def _moe_forward_fake(layer, hidden, router_logits, out, routing_replay_out, forced_ids, topk_ids,
                      topk_weights) -> None:
    return None


# ---- torch.ops.moekit.replay_weights: the routing weights of forced ids (moekit.torch.replay_routing).
# Configs are passed by handle, like layers; equal configs share one.
_configs: Dict[int, "_moekit.MoeConfig"] = {}
_config_handles: Dict[str, int] = {}


def register_config(cfg: "_moekit.MoeConfig") -> int:
    key = repr(cfg)
    if key not in _config_handles:
        handle = next(_next_handle)
        _configs[handle] = cfg
        _config_handles[key] = handle
    return _config_handles[key]


def config_of(handle: int) -> "_moekit.MoeConfig":
    try:
        return _configs[handle]
    except KeyError:
        raise ValueError(f"moekit config handle {handle} is unknown") from None


@torch.library.custom_op("moekit::replay_weights", mutates_args=())
def replay_weights(router_logits: torch.Tensor, forced_ids: torch.Tensor, score_bias: Optional[torch.Tensor],
                   config: int) -> torch.Tensor:
    """weights [M, k] float32: the routing kernel's weights of forced_ids [M, k] from router_logits."""
    from .layer import route  # late: layer imports this module
    forced = forced_ids.to(torch.int32).contiguous()
    _, w = route(router_logits.detach().contiguous(), config_of(config), score_bias, forced)
    return w


@replay_weights.register_fake
def _replay_weights_fake(router_logits, forced_ids, score_bias, config):
    return router_logits.new_empty((router_logits.shape[0], forced_ids.shape[1]), dtype=torch.float32)
