// Fuzz target: the model-folder reader (load_checkpoint_layer_in_memory, the
// loader of folders and live blocks) over a parsed safetensors image, under the
// configs of five families: Qwen3-MoE in bf16, in fp8 (block scales) and in
// compressed-tensors INT4 (group 32), gpt-oss with MXFP4 experts (dequantized,
// and kept packed), DeepSeek-V3 with shared experts and a selection bias. A
// layer it loads must have the shapes its config.json says.
#include <cstddef>
#include <cstdint>

#include "moekit/checkpoint.h"
#include "moekit/io.h"

namespace {

const char* const kConfigs[] = {
    R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 8, "hidden_act": "silu"})",
    R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 8, "hidden_act": "silu",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})",
    R"({"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 32, "num_local_experts": 2,
        "num_experts_per_tok": 1, "intermediate_size": 32, "quantization_config": {"quant_method": "mxfp4"}})",
    R"({"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 32, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 8, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
        "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "hidden_act": "silu"})",
    R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 32, "num_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 32, "hidden_act": "silu",
        "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
        "symmetric": true, "strategy": "group", "group_size": 32}}}, "ignore": ["lm_head"]}})",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  for (const char* config : kConfigs) {
    for (const bool packed : {false, true}) {
      StatusOr<io::SafetensorsFile> f = io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
      if (!f.ok()) return 0;
      CheckpointLoadOptions options;
      options.keep_packed_weights = packed;
      StatusOr<CheckpointLayer> c = load_checkpoint_layer_in_memory(config, std::move(*f), 1, options);
      if (!c.ok()) continue;
      const MoeConfig& m = c->config;
      const QuantScheme& q = m.quant;
      const int64_t n1 = m.activation.gated() ? 2 * m.intermediate : m.intermediate;
      const auto& w13 = c->w13.shape();
      const auto& w2 = c->w2.shape();
      if (w13 != std::vector<int64_t>{m.num_experts, n1, q.stored_cols(m.hidden)} ||
          w2 != std::vector<int64_t>{m.num_experts, m.hidden, q.stored_cols(m.intermediate)} ||
          c->w13.dtype() != c->w2.dtype() || c->w13.dtype() != q.weight_dtype ||
          (q.is_weight4() && (c->w13_scale.shape() != std::vector<int64_t>{m.num_experts, n1,
                                                                            m.hidden / weight4_group(q.method)} ||
                              c->w2_scale.shape() != std::vector<int64_t>{m.num_experts, m.hidden,
                                                                           m.intermediate / weight4_group(q.method)})) ||
          (m.shared_intermediate > 0 &&
           c->shared_w13.shape() != std::vector<int64_t>{2 * m.shared_intermediate, m.hidden})) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
