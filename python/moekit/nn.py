"""moekit.nn.MoE: a transformers sparse-MoE block as a torch module that runs moekit.

The block's own submodules (router, experts, shared expert and its gate) become the
module's, under their own names, so its parameters and state_dict keys are the
checkpoint's: load_state_dict, save_pretrained, optimizers and named_parameters see
what they saw before. moekit runs a prepared copy of those weights, made from them by
the checkpoint loader (one reader for folders and live blocks) and made again when
they change (refit(), automatic after an in-place update such as an optimizer step:
in place, into the same native layer's buffers; after .to(): a new layer).

Every forward computes the router logits with the block's own router module (its
forward hooks fire, so output_router_logits=True still records them and a replay can
force its ids). Then:
  - no gradient needed (inference, torch.no_grad(), generate()): moekit's layer routes
    and runs the experts (the monolithic kernel where one serves);
  - a gradient needed (training; train_path="moekit", the default): the value is
    moekit's layer run on the router's ids (the ids a replay forced, or the live
    top-k), the same forward inference runs for those ids; the backward re-runs the
    block's own torch modules on the saved input with that routing (ids and weights
    fixed, as activation checkpointing does) and returns their autograd gradients:
    to the hidden states, to the routing weights (so to the router) and to every
    expert and shared-expert parameter. They are the gradients of the transformers
    block under the same routing, evaluated at moekit's forward values;
  - train_path="transformers": the block's own forward and backward, as unpatched.
"""
import copy
import json
import warnings
import weakref
from typing import Dict, Optional

import torch

from . import _moekit
from ._torch import flag
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
# The config model_type(s) each block is built from: a block with another family's config
# would be read by that family's rules (its top-k, its routing) without an error.
_FAMILY_MODEL_TYPES = {
    "MixtralSparseMoeBlock": ("mixtral",),
    "Qwen2MoeSparseMoeBlock": ("qwen2_moe",),
    "Qwen3MoeSparseMoeBlock": ("qwen3_moe",),
    "DeepseekV3MoE": ("deepseek_v3",),
    "Glm4MoeMoE": ("glm4_moe",),
    "GptOssMLP": ("gpt_oss",),
}
MODEL_TYPES = tuple(sorted({t for types in _FAMILY_MODEL_TYPES.values() for t in types}))


def is_moe_block(module: torch.nn.Module) -> bool:
    """Whether `module` is a sparse-MoE block of a family moekit runs."""
    return type(module).__name__ in _FAMILY_BLOCKS


def looks_like_moe_block(module: torch.nn.Module) -> bool:
    """Whether `module` is some family's MoE block (moekit's or not): it holds experts or a router
    (OLMoE's and Llama4's blocks hold `experts`, GraniteMoE's a `router`)."""
    return any(hasattr(module, a) for a in ("experts", "router")) or type(module).__name__.endswith(("MoE", "Moe"))


def _check_model_config(block_name: str, model_config) -> None:
    """A transformers config of the block's own family (a dict or None is not one)."""
    if not callable(getattr(model_config, "to_dict", None)) or not hasattr(model_config, "model_type"):
        raise TypeError(f"model_config: expected the model's transformers config (model.config), got "
                        f"{type(model_config).__module__}.{type(model_config).__qualname__}")
    if model_config.model_type not in _FAMILY_MODEL_TYPES[block_name]:
        raise ValueError(f"model_config: model_type {model_config.model_type!r} is not the family of a "
                         f"{block_name} ({', '.join(_FAMILY_MODEL_TYPES[block_name])})")


def router_of(block: torch.nn.Module) -> torch.nn.Module:
    """A family block's router module (a MoE's: the wrapped block's)."""
    inner = block.block if isinstance(block, MoE) else block
    return getattr(block, _FAMILY_BLOCKS[type(inner).__name__][0])


def in_spec_order(spec_ids: torch.Tensor, ids: torch.Tensor):
    """ids [M, k] with each row whose set equals the routing spec's (spec_ids [M, k], the spec's order)
    written in the spec's order; rows of another set (a near-tie another top-k broke otherwise) as given.
    Also which rows agreed, [M, 1] bool."""
    same = (spec_ids.sort(dim=1).values == ids.sort(dim=1).values).all(dim=1, keepdim=True)
    return torch.where(same, spec_ids, ids), same


TRAIN_PATHS = ("moekit", "transformers")  # what a forward that needs gradients runs


# --- Writes a tensor's version counter does not see ---
# `p.data` is an alias of p with a version counter of its own (so `p.data.copy_(w)` leaves p._version as
# it was), and `p.data = new` swaps p's storage. A patched block's weights get a class whose `data`
# property records both (_Watch); a forward then compares a fingerprint of each weight (its identity,
# storage, version counter and watch epoch) with the one of the last preparation. Writes outside torch
# (a NumPy view, DLPack, a raw pointer) are not seen: refit() after them.

class _Watch:
    """What went through one weight's `.data`: epoch grows with every write seen (or possible).
    Aliases handed out since the last poll are held (a temporary `p.data.mul_(2)` dies before the next
    forward) and checked at the poll; one still alive then is followed by a weak reference, and its
    death counts as a write (it may have been written after the poll)."""
    __slots__ = ("epoch", "fresh", "kept", "quiet")

    def __init__(self):
        self.epoch, self.fresh, self.kept, self.quiet = 0, [], {}, False

    def handed_out(self, alias: torch.Tensor) -> None:
        self.fresh.append((alias, alias._version))
        if len(self.fresh) > 64:  # a loop of reads with no forward: bound what is held
            self.poll()

    def _died(self, ref) -> None:
        self.kept.pop(id(ref), None)
        if not self.quiet:
            self.epoch += 1

    def poll(self) -> int:
        for key, (ref, version) in list(self.kept.items()):
            alias = ref()
            if alias is not None and alias._version != version:
                self.epoch += 1
                self.kept[key] = (ref, alias._version)
            del alias
        fresh, self.fresh = self.fresh, []
        for alias, version in fresh:
            if alias._version != version:
                self.epoch += 1
            ref = weakref.ref(alias, self._died)
            self.kept[id(ref)] = (ref, alias._version)
        self.quiet = True  # the aliases only we held die here, checked: no write is possible after
        try:
            del fresh[:]
            alias = None
        finally:
            self.quiet = False
        return self.epoch


_WATCHES: Dict[int, _Watch] = {}  # id(weight) -> its watch, while the weight lives


def _watch_of(t: torch.Tensor) -> Optional[_Watch]:
    return _WATCHES.get(id(t))


class _WatchedData:
    """The `data` property of a watched weight: torch's, recorded."""
    __slots__ = ()

    @property
    def data(self):
        alias = torch._C.TensorBase.data.__get__(self)
        w = _watch_of(self)
        if w is not None:
            w.handed_out(alias)
        return alias

    @data.setter
    def data(self, new):
        torch._C.TensorBase.data.__set__(self, new)
        w = _watch_of(self)
        if w is not None:
            w.epoch += 1


class _WatchedParameter(_WatchedData, torch.nn.Parameter):
    pass


class _WatchedBuffer(_WatchedData, torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl  # results are plain tensors, as a buffer's

    def __deepcopy__(self, memo):
        if id(self) not in memo:
            memo[id(self)] = copy.deepcopy(self.as_subclass(torch.Tensor), memo)
        return memo[id(self)]


_WATCHED_CLASSES = {torch.nn.Parameter: _WatchedParameter, torch.Tensor: _WatchedBuffer}


def _watch(t: torch.Tensor) -> None:
    """Gives a weight of class Parameter or Tensor the recording `data` property (another class, e.g.
    a quantized parameter's, is followed through its version counter and storage only)."""
    watched = _WATCHED_CLASSES.get(type(t))
    if watched is not None:
        t.__class__ = watched
    if isinstance(t, _WatchedData) and id(t) not in _WATCHES:
        _WATCHES[id(t)] = _Watch()
        weakref.finalize(t, _WATCHES.pop, id(t), None)


def _unwatch(t: torch.Tensor) -> None:
    for plain, watched in _WATCHED_CLASSES.items():
        if type(t) is watched:
            t.__class__ = plain

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
    batch_invariant, capture: as MoeConfig's (batch_invariant covers moekit's layer, not the
    block's router, which is transformers' F.linear); train_path: "moekit" or "transformers",
    what a forward that needs gradients runs (module docstring)."""

    def __init__(self, block: torch.nn.Module, model_config, layer_index: int, max_num_tokens: int = 4096,
                 backend: str = "auto", batch_invariant: bool = False, capture: bool = True,
                 train_path: str = "moekit"):
        super().__init__()
        name = type(block).__name__
        if name not in _FAMILY_BLOCKS:
            raise ValueError(f"block: {name} is not a sparse-MoE block moekit runs "
                             f"({', '.join(sorted(_FAMILY_BLOCKS))})")
        if train_path not in TRAIN_PATHS:
            raise ValueError(f"train_path: expected one of {', '.join(TRAIN_PATHS)}, got {train_path!r}")
        _check_model_config(name, model_config)
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
                            batch_invariant=flag("batch_invariant", batch_invariant),
                            capture=flag("capture", capture),
                            train_path=str(train_path))
        self.layer: Optional[MoeLayer] = None
        self.runs_transformers: Optional[str] = None  # why the block runs transformers' forward (_apply)
        self.refit()
        self._check_block_agrees()

    @classmethod
    def from_transformers(cls, block: torch.nn.Module, model_config=None, layer_index: Optional[int] = None,
                          **options) -> "MoE":
        """The module for a live transformers block (model_config: block.config when omitted).
        layer_index is required: it decides which rules of the config apply (DeepSeek-V3's first
        layers are dense, gpt-oss's layer types alternate) and names the block's tensors."""
        model_config = model_config if model_config is not None else getattr(block, "config", None)
        if model_config is None:
            raise ValueError("model_config: this block carries no config; pass the model's (model.config)")
        if layer_index is None:
            raise ValueError("layer_index: required, the block's decoder layer (model.model.layers[i].mlp: i)")
        return cls(block, model_config, layer_index, **options)

    def _check_block_agrees(self) -> None:
        """The block's own sizes (its router's top-k and expert count, where it keeps them) are the
        ones moekit read from the config: a config of another model is refused, not run."""
        cfg, router = self.layer.config, getattr(self, self._router_name)
        for module in (self.block, router):
            for attr, ours in (("top_k", cfg.top_k), ("num_experts", cfg.num_experts)):
                theirs = getattr(module, attr, None)
                if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs != ours:
                    raise ValueError(f"model_config: says {attr} = {ours}, but the block's "
                                     f"{type(module).__name__}.{attr} is {theirs} (the config of another model?)")

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
        for t in self._weights():
            _watch(t)
        self._prepared = self._fingerprint()

    def _unwatch_weights(self) -> None:
        """The weights' own classes back (unpatch)."""
        for t in self._weights():
            _unwatch(t)

    def _fingerprint(self) -> list:
        """What a write changes, per weight: the tensor, its storage, its version counter and the writes
        through its `.data` (module section above). Compared before every eager forward: measured in
        docs/transformers.md ("Refit")."""
        out = []
        for t in self._weights():
            w = _watch_of(t)
            out.append((id(t), t.data_ptr(), t._version, None if w is None else w.poll()))
        return out

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        # .to(device/dtype): the prepared copy follows the weights. Where moekit does not run the new
        # ones (.half(): f16 weights), torch has converted part of the model already and cannot be
        # stopped half way, so the block runs transformers' own forward (a warning says why) until a
        # conversion moekit runs (.bfloat16(), .float()) brings moekit's layer back.
        try:
            self.refit()
            self.runs_transformers = None
        except ValueError as e:
            self.runs_transformers = str(e)
            warnings.warn(f"moekit: layer {self.layer_index} runs transformers' forward after this conversion: {e}",
                          RuntimeWarning, stacklevel=2)
        return out

    def __deepcopy__(self, memo):
        block = copy.deepcopy(self.block, memo)
        return type(self)(block, self.model_config, self.layer_index, **self.options)

    def extra_repr(self) -> str:
        layer = self.layer
        if self.runs_transformers is not None:
            return f"transformers' forward ({self.runs_transformers}), layer {self.layer_index}"
        return f"moekit {layer.backend}/{layer.kernel}, layer {self.layer_index}" if layer is not None else ""

    def _needs_grad(self, hidden_states: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (hidden_states.requires_grad or
                                            any(p.requires_grad for p in self.parameters()))

    def train(self, mode: bool = True) -> "MoE":
        super().train(mode)
        self.block.training = mode  # not a submodule, but its forward (train_path="transformers") reads it
        return self

    def forward(self, hidden_states: torch.Tensor):
        training = self._needs_grad(hidden_states)
        if self.runs_transformers is not None:  # weights moekit does not run (_apply)
            return self.block(hidden_states)
        if training and self.options["train_path"] == "transformers":
            return self.block(hidden_states)  # transformers' own forward and backward
        # Mixtral's router jitter, in train mode, as its block applies it (the same draw from torch's generator).
        jitter = getattr(self.block, "jitter_noise", 0.0)
        if self.training and jitter > 0:
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(1.0 - jitter, 1.0 + jitter)
        # A write to a weight since the last preparation (an optimizer step, load_state_dict, p.data...).
        # Not looked for inside torch.compile, where tensor versions are not graph values:
        # a compiled model calls refit() itself after changing its weights.
        if not torch.compiler.is_compiling() and self._fingerprint() != self._prepared:
            self.refit()
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        router_out = getattr(self, self._router_name)(x)  # the block's own router: its hooks fire
        logits, weights, ids = router_out[0], router_out[1], router_out[2]
        # Under a replay the router's ids are the forced ones; otherwise moekit routes (fused where it can).
        replaying = getattr(getattr(self, self._router_name), "_moekit_replaying", False)
        if training:
            # moekit's value for the router's ids; the block's own modules give the gradient (_TrainingForward).
            out = _TrainingForward.apply(self, replaying, hidden_states, logits.detach(), weights, ids,
                                         *self._trained_params())
        else:
            out = self._moekit_value(hidden_states, logits, ids if replaying else None)
        return (out, weights) if self._returns_scores else out

    def _moekit_value(self, hidden_states: torch.Tensor, logits: torch.Tensor, forced: Optional[torch.Tensor],
                      return_ids: bool = False):
        """moekit's layer on hidden_states [..., H] (routed by itself, or on forced ids [M, k]), in pieces of
        max_num_tokens rows; the output in the input's shape and dtype (and the ids it ran, [M, k] int32)."""
        shape = hidden_states.shape
        x = hidden_states.detach().reshape(-1, shape[-1]).to(self._act_dtype)
        logits = logits.detach()
        out = torch.empty_like(x)
        step = self.options["max_num_tokens"]
        if forced is not None:
            forced = forced.to(device="cpu", dtype=torch.int32)
        ran = []
        for s in range(0, x.shape[0], step):
            got = self.layer(x[s:s + step], logits[s:s + step].float(), out=out[s:s + step], return_ids=return_ids,
                             forced_ids=None if forced is None else forced[s:s + step])
            if return_ids:
                ran.append(got[1])
        out = out.reshape(shape).to(hidden_states.dtype)
        return (out, torch.cat(ran)) if return_ids else out

    def _training_value(self, hidden_states: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor,
                        replaying: bool) -> torch.Tensor:
        """moekit's forward on the router's ids `ids`, as inference computes it for them: a replay's ids are
        forced (in the captured order); live ones are moekit's own routing (the spec's order, so bit for bit
        the inference forward), forced only in rows where its set differs from the router's (a near-tie
        that transformers' top-k broke otherwise), so the value runs the experts the gradient is taken for."""
        if replaying:
            return self._moekit_value(hidden_states, logits, ids)
        out, ran = self._moekit_value(hidden_states, logits, None, return_ids=True)
        merged, same = in_spec_order(ran.to(ids.device, torch.int64), ids)
        return out if bool(same.all()) else self._moekit_value(hidden_states, logits, merged)

    def _trained_params(self) -> list:
        """The block's parameters that take gradients, the router's excepted (its gradient flows through
        the routing weights, outside the layer)."""
        router = set(id(p) for p in getattr(self, self._router_name).parameters())
        return [p for p in self.block.parameters() if p.requires_grad and id(p) not in router]


class _FixedRouter(torch.nn.Module):
    """Stands in for a block's router while the backward re-runs the block: the saved routing, not a new one
    (and no hooks: a capture or replay sees the forward's one router call only)."""

    def __init__(self, logits, weights, ids):
        super().__init__()
        self.routing = (logits, weights, ids)

    def forward(self, hidden_states):
        return self.routing


class _TrainingForward(torch.autograd.Function):
    """A patched block's training forward (MoE's module docstring): value = moekit's layer on the router's
    ids; gradients = autograd of the block's own modules, re-run on the saved input with the same routing.

    forward(moe, replaying, hidden [B, S, H], logits [M, E] (detached), weights [M, k], ids [M, k], *params)."""

    @staticmethod
    def forward(ctx, moe, replaying, hidden, logits, weights, ids, *params):
        ctx.moe = weakref.ref(moe)  # a graph left unfreed at exit must not keep the native layers alive
        ctx.save_for_backward(hidden, logits, weights, ids, *params)
        with torch.no_grad():
            return moe._training_value(hidden, logits, ids, replaying)

    @staticmethod
    def backward(ctx, grad_out):
        hidden, logits, weights, ids, *params = ctx.saved_tensors
        moe = ctx.moe()
        if moe is None:
            raise RuntimeError("moekit.nn.MoE: the module was deleted before the backward of its forward")
        needs = ctx.needs_input_grad  # (moe, replaying, hidden, logits, weights, ids, *params)
        with torch.enable_grad():
            h = hidden.detach().requires_grad_(needs[2])
            w = weights.detach().requires_grad_(needs[4])
            router, training = getattr(moe.block, moe._router_name), moe.block.training
            setattr(moe.block, moe._router_name, _FixedRouter(logits, w, ids))
            moe.block.training = False  # the saved input carries the forward's router jitter already
            try:
                ref = moe.block(h)
            finally:
                setattr(moe.block, moe._router_name, router)
                moe.block.training = training
            ref = ref[0] if moe._returns_scores else ref
            wanted = [(i, t) for i, t in [(2, h), (4, w)] + [(6 + j, p) for j, p in enumerate(params)] if needs[i]]
            grads = torch.autograd.grad(ref, [t for _, t in wanted], grad_out, allow_unused=True) if wanted else ()
        out = [None] * len(needs)
        for (i, _), g in zip(wanted, grads):
            out[i] = g
        return tuple(out)
