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
