"""moekit.nn.MoE: a transformers sparse-MoE block as a torch module that runs moekit.

The block's own submodules (router, experts, shared expert and its gate) become the
module's, under their own names, so its parameters and state_dict keys are the
checkpoint's: load_state_dict, save_pretrained, optimizers and named_parameters see
what they saw before. moekit runs a prepared copy of those weights, made from them by
the checkpoint loader (one reader for folders and live blocks) and made again when
they change (refit(), automatic after an in-place update such as an optimizer step:
in place, into the same native layer's buffers; after .to(): a new layer).

Which path runs a forward:
  - no gradient needed (inference, torch.no_grad(), generate()): moekit's layer, with
    the router logits computed by the block's own router module (its forward hooks
    fire, so output_router_logits=True still records them);
  - a gradient needed (training): the block's own transformers forward, so the
    gradients to router and experts are exactly transformers' (moekit's layer has no
    backward yet).
"""
import copy
import json
from typing import Dict, Optional

import torch

from . import _moekit
from .layer import MoeLayer

# The sparse-MoE block of each family the loader reads: its router's attribute,
# and whether the block also returns the router's scores (gpt-oss: (out, scores)).
_FAMILY_BLOCKS = {
    "MixtralSparseMoeBlock": ("gate", False),
    "Qwen2MoeSparseMoeBlock": ("gate", False),
    "Qwen3MoeSparseMoeBlock": ("gate", False),
    "DeepseekV3MoE": ("gate", False),
    "Glm4MoeMoE": ("gate", False),
    "GptOssMLP": ("router", True),
}


def is_moe_block(module: torch.nn.Module) -> bool:
    """Whether `module` is a sparse-MoE block of a family moekit runs."""
    return type(module).__name__ in _FAMILY_BLOCKS


def router_of(block: torch.nn.Module) -> torch.nn.Module:
    """A family block's router module (a MoE's: the wrapped block's)."""
    inner = block.block if isinstance(block, MoE) else block
    return getattr(block, _FAMILY_BLOCKS[type(inner).__name__][0])


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                       torch.float8_e4m3fn: "F8_E4M3", torch.uint8: "U8", torch.int8: "I8",
                       torch.int32: "I32", torch.int64: "I64", torch.float64: "F64"}


def _tensor_views(tensors: Dict[str, torch.Tensor]) -> list:
    """The tensors as the loader reads them in place: (name, safetensors dtype, shape,
    the bytes as a 1-D uint8 CPU tensor), with no copy of a contiguous CPU tensor
    (a device tensor or a strided one is copied once)."""
    views = []
    for name, t in tensors.items():
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name moekit reads")
        c = t.detach().to("cpu").contiguous()
        views.append((name, _SAFETENSORS_DTYPES[t.dtype], list(t.shape), c.reshape(-1).view(torch.uint8)))
    return views


class MoE(torch.nn.Module):
    """A transformers sparse-MoE block run by moekit (module docstring).

    block: the live block (e.g. model.model.layers[i].mlp); model_config: the model's
    transformers config (routing, family); layer_index: the block's decoder layer.
    max_num_tokens: rows per moekit call (longer inputs run in pieces); backend,
    batch_invariant, capture: as MoeConfig's."""

    def __init__(self, block: torch.nn.Module, model_config, layer_index: int, max_num_tokens: int = 4096,
                 backend: str = "auto", batch_invariant: bool = False, capture: bool = True):
        super().__init__()
        name = type(block).__name__
        if name not in _FAMILY_BLOCKS:
            raise ValueError(f"block: {name} is not a sparse-MoE block moekit runs "
                             f"({', '.join(sorted(_FAMILY_BLOCKS))})")
        self._router_name, self._returns_scores = _FAMILY_BLOCKS[name]
        for child_name, child in block.named_children():
            self.add_module(child_name, child)
        for p_name, p in block.named_parameters(recurse=False):
            self.register_parameter(p_name, p)
        for b_name, b in block.named_buffers(recurse=False):
            self.register_buffer(b_name, b)
        # Not a submodule: its parameters are this module's already (shared objects).
        object.__setattr__(self, "block", block)
        self.model_config = model_config
        self.layer_index = int(layer_index)
        self.options = dict(max_num_tokens=int(max_num_tokens), backend=str(backend),
                            batch_invariant=bool(batch_invariant), capture=bool(capture))
        self.layer: Optional[MoeLayer] = None
        self._forced_ids: Optional[torch.Tensor] = None  # [M, k] during a replay (moekit.transformers.replay)
        self.refit()

    @classmethod
    def from_transformers(cls, block: torch.nn.Module, model_config=None, layer_index: int = 0, **options) -> "MoE":
        """The module for a live transformers block (model_config: block.config when omitted)."""
        model_config = model_config if model_config is not None else getattr(block, "config", None)
        if model_config is None:
            raise ValueError("model_config: this block carries no config; pass the model's (model.config)")
        return cls(block, model_config, layer_index, **options)

    def _weights(self):
        return list(self.parameters()) + list(self.buffers())

    def refit(self) -> None:
        """Prepares moekit's copy of the current weights (after they changed in a way
        refit cannot see, e.g. p.data = ...; in-place updates are seen by themselves)."""
        prefix = f"model.layers.{self.layer_index}.mlp."
        tensors = {prefix + n: t.detach() for n, t in self.state_dict().items()}
        config = {k: v for k, v in self.model_config.to_dict().items() if v is not None or k != "quantization_config"}
        device = next(iter(self._weights())).device
        # With the config unchanged the native layer is updated in place (its buffers, and a CUDA graph
        # captured over it, stay valid); otherwise (another device or dtype) a new one is made.
        loaded = _moekit.load_checkpoint_layer_in_memory(
            json.dumps(config, default=str), _tensor_views(tensors), self.layer_index,
            self.options["max_num_tokens"],
            device.type, device.index or 0, self.options["backend"], self.options["batch_invariant"],
            self.options["capture"], into=None if self.layer is None else self.layer._layer)
        if self.layer is not None and loaded[0] is self.layer._layer:
            self.layer._refitted(loaded)
        else:
            previous, self.layer = self.layer, MoeLayer._of_checkpoint(device, loaded)
            # A new layer keeps the workspace the old one ran with (its own, or its patched model's).
            if previous is not None:
                self.layer._layer.adopt_workspace(previous._layer)
        # Read here, not in forward(): torch.compile cannot trace the native config's properties.
        self._act_dtype = torch.float32 if self.layer.config.act_dtype == "f32" else torch.bfloat16
        self._versions = [t._version for t in self._weights()]

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.refit()  # .to(device/dtype): the prepared copy follows the weights
        return out

    def __deepcopy__(self, memo):
        block = copy.deepcopy(self.block, memo)
        return type(self)(block, self.model_config, self.layer_index, **self.options)

    def extra_repr(self) -> str:
        layer = self.layer
        return f"moekit {layer.backend}/{layer.kernel}, layer {self.layer_index}" if layer is not None else ""

    def forward(self, hidden_states: torch.Tensor):
        if torch.is_grad_enabled() and any(t.requires_grad for t in self.parameters()):
            return self.block(hidden_states)  # training: transformers' own path and gradients
        # An in-place update (an optimizer step, load_state_dict) since the last preparation.
        # Not looked for inside torch.compile, where tensor versions are not graph values:
        # a compiled model calls refit() itself after changing its weights.
        if not torch.compiler.is_compiling() and [t._version for t in self._weights()] != self._versions:
            self.refit()
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router_out = getattr(self, self._router_name)(x)  # the block's own router: its hooks fire
        logits = router_out[0]
        x = x.to(self._act_dtype)
        out = torch.empty_like(x)
        step = self.options["max_num_tokens"]
        forced = self._forced_ids  # set by moekit.transformers.replay (every row forced)
        if forced is not None:
            forced = forced.to(device="cpu", dtype=torch.int32)
        for s in range(0, x.shape[0], step):
            self.layer(x[s:s + step], logits[s:s + step].float(), out=out[s:s + step],
                       forced_ids=None if forced is None else forced[s:s + step])
        out = out.reshape(shape).to(hidden_states.dtype)
        return (out, router_out[1]) if self._returns_scores else out
