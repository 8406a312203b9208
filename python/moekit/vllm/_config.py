"""What moekit can serve of a vLLM MoE layer: its MoeConfig, or the reason it stays vLLM's.

Two stages, because vLLM builds the quant method from the FusedMoEConfig alone and
hands over the layer (routing details, weights) only when the weights are loaded:
  config_reason(moe):  what the FusedMoEConfig already rules out;
  layer_config(layer): the MoeConfig of a loaded layer, or ValueError(reason).
"""
from typing import Optional

import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, RoutingMethodType

from .. import _moekit

# vLLM's routing methods that are moekit's, one to one (docs/routing.md).
ROUTING = {
    RoutingMethodType.Default: "softmax_topk",
    RoutingMethodType.Renormalize: "renormalize",
    RoutingMethodType.RenormalizeNaive: "renormalize_naive",
    RoutingMethodType.TopK: "topk",
    RoutingMethodType.Sigmoid: "sigmoid",
    RoutingMethodType.SigmoidRenorm: "sigmoid_renorm",
    RoutingMethodType.Llama4: "llama4",
    RoutingMethodType.DeepSeekV3: "deepseek_v3",
}
# vLLM's activations that compute what moekit's do (moekit's gelu is the tanh form).
ACTIVATIONS = {MoEActivation.SILU: "silu", MoEActivation.GELU_TANH: "gelu", MoEActivation.RELU2_NO_MUL: "relu2"}
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def config_reason(moe: FusedMoEConfig) -> Optional[str]:
    """Why vLLM's own method must run a layer of this FusedMoEConfig, or None."""
    if moe.routing_method not in ROUTING:
        return f"routing method {moe.routing_method.name} is not one of moekit's"
    if moe.activation not in ACTIVATIONS:
        return f"activation {moe.activation.value} is not one of moekit's"
    if moe.is_lora_enabled:
        return "LoRA adapters run through vLLM's LoRA-aware experts"
    if moe.has_bias:
        return "expert biases (vLLM's layout for them is not mapped to moekit's)"
    if moe.has_hash_routing:
        return "hash routing"
    p = moe.moe_parallel_config
    if p.use_ep or p.dp_size > 1 or p.tp_size > 1 or moe.num_local_experts != moe.num_logical_experts:
        return (f"parallel layout tp={p.tp_size} dp={p.dp_size} ep={p.ep_size} (vLLM's dispatch and all-reduce "
                "around sharded experts stay vLLM's)")
    if moe.in_dtype not in DTYPES:
        return f"activation dtype {moe.in_dtype} (moekit runs f32 and bf16)"
    if torch.device(moe.device).type not in ("cpu", "cuda"):
        return f"device {moe.device}"
    return None


def layer_config(layer, max_num_tokens: int, backend: str, batch_invariant: bool) -> "_moekit.MoeConfig":
    """The MoeConfig of a loaded vLLM RoutedExperts layer; ValueError naming what moekit cannot serve."""
    moe: FusedMoEConfig = layer.moe_config
    reason = config_reason(moe)
    if reason is not None:
        raise ValueError(reason)
    method = ROUTING[moe.routing_method]
    grouping, scale = {}, float(layer.routed_scaling_factor or 1.0)
    if method == "deepseek_v3":
        grouping = dict(num_groups=int(layer.num_expert_group or 1), topk_groups=int(layer.topk_group or 1),
                        routed_scaling_factor=scale, renormalize=bool(layer.renormalize))
    elif layer.use_grouped_topk and (layer.num_expert_group or 1) > 1:
        # vLLM's CPU router reports grouped softmax routing (DeepSeek-V2) as plain softmax.
        raise ValueError(f"grouped {layer.scoring_func} routing ({layer.num_expert_group} groups) is not one of moekit's")
    elif scale != 1.0:
        raise ValueError(f"routed_scaling_factor {scale} with {method} routing (moekit scales deepseek_v3 only)")
    if layer.custom_routing_function is not None and method != "llama4":
        raise ValueError("a custom routing function")
    if layer.apply_router_weight_on_input:
        raise ValueError("router weights applied to the input (apply_router_weight_on_input)")
    w13, w2 = layer.w13_weight, layer.w2_weight
    if w13.dtype not in DTYPES or w2.dtype != w13.dtype:
        raise ValueError(f"expert weights of dtype {w13.dtype} (moekit runs f32 and bf16)")
    E, n1, H = w13.shape
    return _moekit.MoeConfig(
        num_experts=E, top_k=moe.experts_per_token, hidden_size=H, intermediate_size=w2.shape[2], routing=method,
        activation=ACTIVATIONS[moe.activation], max_num_tokens=max_num_tokens, backend=backend,
        weight_dtype=DTYPES[w13.dtype], act_dtype=DTYPES[moe.in_dtype], logits_dtype="f32", capture=True,
        batch_invariant=batch_invariant, **grouping)
