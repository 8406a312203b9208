// config.json of a model folder -> the MoeConfig of its MoE layers, per family
// (docs/layer_files.md lists every field read). Fields a family can set that
// moekit cannot run are refused by name, never ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::io {

// The experts' row layout in a fused gate_up_proj tensor.
enum class GateUpOrder : uint8_t {
  kChunked,      // gate rows, then up rows (Mixtral, Qwen, DeepSeek, GLM)
  kInterleaved,  // gate 2i, up 2i+1 (gpt-oss)
};

struct ModelMoeConfig {
  MoeConfig config;  // max_num_tokens 1; weight/act dtypes set from the tensors later
  std::string model_type;
  int num_layers = 0;
  GateUpOrder gate_up_order = GateUpOrder::kChunked;
  bool fused_transposed = false;  // the family stores fused experts [E, H, 2I] / [E, I, H] (gpt-oss)
  // "quantization_config" of an fp8 checkpoint: the scheme its experts carry.
  std::optional<QuantMethod> fp8_scheme;
  // "quantization_config" quant_method "mxfp4" (gpt-oss): the experts come as
  // MXFP4 blocks and scales (dequantized to bf16 on load).
  bool mxfp4_experts = false;
  // "quantization_config" quant_method "compressed-tensors", format
  // "pack-quantized", symmetric 4-bit int weights in groups of 32 or 128
  // (Kimi-K2): int4_g32 / int4_g128, the experts' weight_packed read as stored.
  std::optional<QuantMethod> int4_scheme;
  // ok when model layer `layer` is an MoE layer by the config's own rule, else
  // why not (e.g. "first_k_dense_replace = 3: layers 0..2 are dense").
  Status moe_layer(int layer) const;

  // The rule's inputs.
  int first_k_dense_replace = 0;  // deepseek_v3, glm4_moe
  int moe_layer_freq = 1;         // deepseek_v3
  int decoder_sparse_step = 1;    // qwen2_moe, qwen3_moe
  std::vector<int> mlp_only_layers;  // qwen2_moe, qwen3_moe
};

// `what` names the file in messages.
StatusOr<ModelMoeConfig> parse_model_config(const nlohmann::json& j, const std::string& what);

}  // namespace moekit::io
