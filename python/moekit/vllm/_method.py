"""moekit's unquantized MoE method for vLLM 0.32 and the monolithic experts class it runs.

vLLM keeps everything around the routed experts: the router module that computes the
logits, shared experts, the all-reduce, the weight loader, its RoutedExpertsCapturer. The
experts class takes the logits and runs moekit's layer (routing inside), writing the ids it
ran into the leading rows of vLLM's routing_replay_out.

Weights: moekit prepares its own layout from vLLM's loaded w13_weight [E, 2I, H] and
w2_weight [E, H, I] (its own layout) and vLLM's copies are then released, so one copy
stays. A reload (vLLM's layerwise reload_weights: RL weight sync) rebuilds vLLM's
parameters, calls process_weights_after_loading again, and moekit's layer takes the new
values in place; the selection bias, which lives on vLLM's gate module, is re-read at the
end of every reload (and by refresh()).
"""
import dataclasses
import logging
import os
import weakref
from typing import Dict, List

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.utils import replace_parameter

from ..layer import MoeLayer
from . import _replay
from ._config import config_reason, layer_config

logger = logging.getLogger("moekit.vllm")

REPORT: List[Dict[str, object]] = []  # one entry per MoE layer built in this process (moekit.vllm.report())
_LAYERS: "weakref.WeakSet[MoekitExperts]" = weakref.WeakSet()  # every replaced layer's experts, for refresh()


@dataclasses.dataclass(frozen=True)
class Options:
    backend: str = "auto"
    batch_invariant: bool = False

    @staticmethod
    def from_env() -> "Options":
        invariant = os.environ.get("MOEKIT_VLLM_BATCH_INVARIANT", "0")
        if invariant not in ("0", "1"):
            raise ValueError(f"MOEKIT_VLLM_BATCH_INVARIANT must be 0 or 1, got {invariant!r}")
        return Options(backend=os.environ.get("MOEKIT_VLLM_BACKEND", "auto"), batch_invariant=invariant == "1")


_options = Options()


def _report(layer, replaced: bool, reason: str = "", experts: "MoekitExperts" = None) -> None:
    entry = {"layer": layer.layer_name, "replaced": replaced, "backend": "", "kernel": "", "reason": reason}
    if experts is not None:
        entry.update(backend=experts.moekit.backend, kernel=experts.moekit.kernel)
    REPORT.append(entry)
    if replaced:
        logger.info("moekit.vllm: %s runs on moekit (%s/%s)", entry["layer"], entry["backend"], entry["kernel"])
    else:
        logger.info("moekit.vllm: %s stays vLLM's: %s", entry["layer"], reason)


class MoekitExperts(mk.FusedMoEExpertsMonolithic):
    """vLLM's monolithic experts interface over one moekit MoeLayer (built in process_weights_after_loading)."""

    moekit: MoeLayer = None
    layer_id: int = -1  # the model layer (vLLM's routed-experts arrays index all hidden layers)
    bias = None  # vLLM's selection bias tensor (on its gate module), or None

    @staticmethod
    def activation_format() -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.Standard

    # What vLLM's oracle would ask; the method checks moekit's own rules before building this class.
    @staticmethod
    def _supports_current_device() -> bool:
        return True

    @staticmethod
    def _supports_no_act_and_mul() -> bool:
        return True

    @staticmethod
    def _supports_quant_scheme(weight_key, activation_key) -> bool:
        return weight_key is None and activation_key is None

    @staticmethod
    def _supports_activation(activation) -> bool:
        return True

    @staticmethod
    def _supports_parallel_config(moe_parallel_config) -> bool:
        return not moe_parallel_config.use_all2all_kernels

    @staticmethod
    def _supports_routing_method(routing_method, weight_key, activation_key) -> bool:
        return True

    @staticmethod
    def _supports_router_logits_dtype(router_logits_dtype, routing_method) -> bool:
        return True

    @staticmethod
    def _supports_batch_invariance() -> bool:
        return _options.batch_invariant

    def supports_routing_replay_capture(self) -> bool:
        return True  # moekit's kernels write the ids they ran (routing_replay_out)

    def process_weights_after_loading(self, layer) -> None:
        bias = layer.e_score_correction_bias
        bias = None if bias is None else bias.detach().float()
        if self.moekit is None:
            config = layer_config(layer, self.moe_config.max_num_tokens, _options.backend, _options.batch_invariant)
            self.moekit = MoeLayer(config, layer.w13_weight.detach(), layer.w2_weight.detach(), score_bias=bias,
                                   device=layer.w13_weight.device)
            self.layer_id = _layer_index(layer.layer_name)
            _LAYERS.add(self)
        else:  # a reload: new values, prepared into the same buffers
            self.moekit.update_weights(layer.w13_weight.detach(), layer.w2_weight.detach(), score_bias=bias)
        self.bias = layer.e_score_correction_bias
        _release_vllm_copies(layer)

    def refresh_score_bias(self) -> None:
        if self.bias is not None:
            self.moekit.update_score_bias(self.bias.detach().float())

    def apply(self, hidden_states, w1, w2, router_logits, activation, global_num_experts, expert_map, a1q_scale,
              apply_router_weight_on_input, num_expert_group=None, e_score_correction_bias=None,
              routed_scaling_factor=None, topk_group=None, routing_replay_out=None):
        forced = _replay.forced_ids(self.layer_id, hidden_states.shape[0], self.moekit.config.top_k)
        return self.moekit(hidden_states, router_logits, forced_ids=forced, routing_replay_out=routing_replay_out)


def _layer_index(layer_name: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index
    return extract_layer_index(layer_name)


def _release_vllm_copies(layer) -> None:
    """vLLM's expert weights, once moekit holds its prepared copy: empty parameters of the same dtype (a
    reload rebuilds them from vLLM's recorded shapes, and copies the processed empties back)."""
    for name in ("w13_weight", "w2_weight"):
        p = getattr(layer, name)
        replace_parameter(layer, name, torch.empty(0, dtype=p.dtype, device=p.device))


class MoekitFusedMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's UnquantizedFusedMoEMethod, with moekit's monolithic experts wherever moekit serves the layer."""

    def __init__(self, moe):
        super().__init__(moe)
        self._moekit_reason = config_reason(moe)
        self._vllm_experts_cls = self.experts_cls
        if self._moekit_reason is None:
            self.experts_cls = MoekitExperts  # is_monolithic, until a loaded layer says otherwise

    def process_weights_after_loading(self, layer) -> None:
        if self.moe_kernel is not None and isinstance(self.moe_kernel.fused_experts, MoekitExperts):
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)  # a reload
            return
        if self._moekit_reason is None:
            try:
                layer_config(layer, self.moe.max_num_tokens, _options.backend, _options.batch_invariant)
            except ValueError as e:
                self._moekit_reason = str(e)
        if self._moekit_reason is not None:
            self.experts_cls = self._vllm_experts_cls
            _report(layer, False, self._moekit_reason)
            super().process_weights_after_loading(layer)
            return
        super(UnquantizedFusedMoEMethod, self).process_weights_after_loading(layer)
        self._init_moe_kernel(layer)  # vLLM's monolithic prepare/finalize around MoekitExperts
        experts = self.moe_kernel.fused_experts
        experts.process_weights_after_loading(layer)
        _report(layer, True, experts=experts)


def refresh() -> int:
    """Re-reads every replaced layer's selection bias from vLLM's tensor (after weights were written other
    than through vLLM's reload); returns how many layers were refreshed."""
    for experts in _LAYERS:
        experts.refresh_score_bias()
    return len(_LAYERS)


def install(options: Options) -> None:
    global _options
    _options = options
    UnquantizedFusedMoEMethod.register_oot(MoekitFusedMoEMethod)
    _refresh_after_reloads()


def _refresh_after_reloads() -> None:
    """vLLM's in-place reload finishes with finalize_layerwise_reload: refresh the selection biases after it
    (the gate module that holds them may be processed after the experts)."""
    from vllm.model_executor.model_loader.reload import inplace
    finalize = inplace.finalize_layerwise_reload
    if getattr(finalize, "_moekit_refresh", False):
        return

    def finalize_and_refresh(*args, **kwargs):
        result = finalize(*args, **kwargs)
        refresh()
        return result

    finalize_and_refresh._moekit_refresh = True
    inplace.finalize_layerwise_reload = finalize_and_refresh
