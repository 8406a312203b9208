"""moekit inside a transformers model: patch() swaps every sparse-MoE block of a
loaded model for moekit.nn.MoE in place, unpatch() puts the blocks back.

transformers stays an optional dependency: only this module and moekit.nn's users
need it, and this module does not import it (it works on the model it is given).
"""
from typing import Dict, List

import torch

from .nn import MoE, is_moe_block


def _decoder_layers(model: torch.nn.Module):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"model: {type(model).__name__} has no decoder layers (model.model.layers)")
    return layers


def patch(model: torch.nn.Module, **layer_options) -> Dict[str, List[dict]]:
    """Swaps the sparse-MoE block (`mlp`) of every decoder layer for a moekit.nn.MoE
    built from it (layer_options: MoE's, e.g. max_num_tokens, backend,
    batch_invariant). Returns {"patched": [{layer, block, backend, kernel}],
    "left": [{layer, block, reason}]}: what was swapped and what was left and why."""
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
            moe = MoE(block, config, i, **layer_options)
            layer.mlp = moe
            report["patched"].append({"layer": i, "block": name, "backend": moe.layer.backend,
                                      "kernel": moe.layer.kernel})
    return report


def unpatch(model: torch.nn.Module) -> int:
    """Puts every patched layer's transformers block back; returns how many."""
    restored = 0
    for layer in _decoder_layers(model):
        block = getattr(layer, "mlp", None)
        if isinstance(block, MoE):
            layer.mlp = block.block
            restored += 1
    return restored
