#include "io/model_config.h"

#include <cmath>
#include <limits>
#include <optional>

#include "io/json_strict.h"

namespace moekit::io {
namespace {

using Json = nlohmann::json;

constexpr const char* kFamilies = "mixtral, qwen2_moe, qwen3_moe, deepseek_v3, glm4_moe, gpt_oss";

// Field readers: a missing field is nullopt; a field of the wrong type is an
// error naming it.
class Fields {
 public:
  Fields(const Json& j, std::string what) : j_(j), what_(std::move(what)) {}

  StatusOr<std::optional<int64_t>> integer(const char* key, int64_t lo, int64_t hi) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return std::optional<int64_t>();
    const std::optional<int64_t> v = json_integer(j_.at(key), lo, hi);
    if (!v) {
      return InvalidArgument(what_ + ": \"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + j_.at(key).dump());
    }
    return v;
  }
  // The first of `keys` present, required.
  StatusOr<int64_t> required_integer(std::initializer_list<const char*> keys, int64_t lo, int64_t hi) const {
    std::string names;
    for (const char* k : keys) {
      MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> v, integer(k, lo, hi));
      if (v) return *v;
      names += (names.empty() ? "\"" : " or \"") + std::string(k) + "\"";
    }
    return InvalidArgument(what_ + ": " + names + " is missing");
  }
  StatusOr<std::optional<double>> number(const char* key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return std::optional<double>();
    const Json& v = j_.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 3e38) {
      return InvalidArgument(what_ + ": \"" + key + "\" must be a finite number, got " + v.dump());
    }
    return std::optional<double>(v.get<double>());
  }
  StatusOr<std::optional<bool>> boolean(const char* key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return std::optional<bool>();
    if (!j_.at(key).is_boolean()) return InvalidArgument(what_ + ": \"" + key + "\" must be true or false");
    return std::optional<bool>(j_.at(key).get<bool>());
  }
  StatusOr<std::optional<std::string>> string(const char* key) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return std::optional<std::string>();
    if (!j_.at(key).is_string()) return InvalidArgument(what_ + ": \"" + key + "\" must be a string");
    return std::optional<std::string>(j_.at(key).get<std::string>());
  }
  const std::string& what() const { return what_; }

 private:
  const Json& j_;
  std::string what_;
};

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// "quantization_config" of an fp8 checkpoint (DeepSeek-V3's: quant_method
// "fp8", fmt "e4m3", weight_block_size [128, 128], activation_scheme
// "dynamic"): the scheme its expert tensors must carry. Any other method or
// field is refused by name: moekit would run it wrong.
StatusOr<QuantMethod> fp8_scheme_of(const Json& q, const std::string& what) {
  const std::string where = what + ": \"quantization_config\"";
  if (!q.is_object()) return InvalidArgument(where + " must be an object");
  const Fields f(q, where);
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> method, f.string("quant_method"));
  if (method != "fp8") {
    return Unsupported(where + ": quant_method " + (method ? "\"" + *method + "\"" : std::string("missing")) +
                       "; moekit loads \"fp8\" checkpoints (e4m3, block-128 or per-tensor scales), \"mxfp4\" "
                       "(gpt-oss), \"compressed-tensors\" (pack-quantized symmetric int4) and bf16/f32 ones");
  }
  for (const auto& [key, value] : q.items()) {
    if (key != "quant_method" && key != "fmt" && key != "weight_block_size" && key != "activation_scheme") {
      return Unsupported(where + ": \"" + key + "\" is not a setting moekit reads; refused rather than ignored");
    }
  }
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> fmt, f.string("fmt"));
  if (fmt && *fmt != "e4m3") return Unsupported(where + ": fmt \"" + *fmt + "\"; moekit reads e4m3");
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> act, f.string("activation_scheme"));
  if (act && *act != "dynamic" && *act != "static") {
    return InvalidArgument(where + ": activation_scheme must be \"dynamic\" or \"static\", got \"" + *act + "\"");
  }
  if (!q.contains("weight_block_size") || q.at("weight_block_size").is_null()) return QuantMethod::kFp8PerTensor;
  const Json& b = q.at("weight_block_size");
  if (b != Json::array({kFp8BlockSize, kFp8BlockSize})) {
    return Unsupported(where + ": weight_block_size " + b.dump() + "; moekit's block scheme is [128, 128]");
  }
  return QuantMethod::kFp8Block128;
}

// gpt-oss's "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}
// (the modules kept in bf16: attention, router, embeddings; the experts are MXFP4).
Status check_mxfp4_config(const Json& q, const std::string& what) {
  for (const auto& [key, value] : q.items()) {
    if (key != "quant_method" && key != "modules_to_not_convert") {
      return Unsupported(what + ": \"quantization_config\": \"" + key +
                         "\" is not a setting moekit reads; refused rather than ignored");
    }
  }
  return Status::Ok();
}

// A compressed-tensors field that must be absent, null or one of `allowed`
// (their JSON spellings); anything else would change what the tensors mean.
Status only(const Json& obj, const char* key, std::initializer_list<Json> allowed, const std::string& where,
            const char* why) {
  if (!obj.contains(key) || obj.at(key).is_null()) return Status::Ok();
  for (const Json& a : allowed) {
    if (obj.at(key) == a) return Status::Ok();
  }
  return Unsupported(where + ": \"" + key + "\" = " + obj.at(key).dump() + ": " + why);
}

Status known_keys(const Json& obj, std::initializer_list<const char*> keys, const std::string& where) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (const char* k : keys) known = known || key == k;
    if (!known) return Unsupported(where + ": \"" + key + "\" is not a setting moekit reads; refused rather than ignored");
  }
  return Status::Ok();
}

// compressed-tensors' "quantization_config" as llm-compressor writes a W4A16
// checkpoint (Kimi-K2): {"quant_method": "compressed-tensors", "format":
// "pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4,
// "type": "int", "symmetric": true, "strategy": "group", "group_size": 32},
// "targets": ["Linear"]}}, "ignore": [...]}. One group of weights-only int4
// is read; any setting that would change the stored values' meaning is refused.
StatusOr<QuantMethod> int4_scheme_of(const Json& q, const std::string& what) {
  const std::string where = what + ": \"quantization_config\"";
  MOEKIT_RETURN_IF_ERROR(known_keys(q, {"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme",
                                        "quantization_status", "sparsity_config", "global_compression_ratio",
                                        "version", "transform_config"},
                                    where));
  const Fields f(q, where);
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> format, f.string("format"));
  if (format && *format != "pack-quantized") {
    return Unsupported(where + ": format \"" + *format + "\"; moekit reads compressed-tensors \"pack-quantized\"");
  }
  MOEKIT_RETURN_IF_ERROR(only(q, "quantization_status", {"compressed"}, where, "moekit reads compressed checkpoints"));
  MOEKIT_RETURN_IF_ERROR(only(q, "kv_cache_scheme", {}, where, "moekit reads no kv cache quantization"));
  MOEKIT_RETURN_IF_ERROR(only(q, "sparsity_config", {Json::object()}, where, "moekit reads dense weights"));
  MOEKIT_RETURN_IF_ERROR(only(q, "transform_config", {Json::object()}, where, "moekit applies no weight transforms"));
  if (q.contains("ignore") && !q.at("ignore").is_null()) {
    const Json& ig = q.at("ignore");
    bool strings = ig.is_array();
    for (const Json& v : strings ? ig : Json::array()) strings = strings && v.is_string();
    if (!strings) return InvalidArgument(where + ": \"ignore\" must be a list of module names");
  }
  if (!q.contains("config_groups") || !q.at("config_groups").is_object() || q.at("config_groups").size() != 1) {
    return Unsupported(where + ": \"config_groups\" must hold exactly one group (moekit reads one int4 scheme), got " +
                       (q.contains("config_groups") ? q.at("config_groups").dump().substr(0, 200) : std::string("none")));
  }
  const auto group = q.at("config_groups").begin();
  const std::string gw = where + ".config_groups." + group.key();
  if (!group.value().is_object()) return InvalidArgument(gw + " must be an object");
  const Json& g = group.value();
  MOEKIT_RETURN_IF_ERROR(known_keys(g, {"weights", "targets", "input_activations", "output_activations", "format"}, gw));
  MOEKIT_RETURN_IF_ERROR(only(g, "format", {"pack-quantized"}, gw, "moekit reads \"pack-quantized\""));
  if (!format && g.value("format", Json()) != "pack-quantized") {
    return Unsupported(where + ": no \"format\"; moekit reads compressed-tensors \"pack-quantized\" checkpoints");
  }
  MOEKIT_RETURN_IF_ERROR(only(g, "input_activations", {}, gw, "moekit reads weight-only int4 (W4A16)"));
  MOEKIT_RETURN_IF_ERROR(only(g, "output_activations", {}, gw, "moekit reads weight-only int4 (W4A16)"));
  if (!g.contains("weights") || !g.at("weights").is_object()) return InvalidArgument(gw + ": \"weights\" is missing");
  const Json& w = g.at("weights");
  const std::string ww = gw + ".weights";
  MOEKIT_RETURN_IF_ERROR(known_keys(w, {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic",
                                        "actorder", "block_structure", "observer", "observer_kwargs", "scale_dtype",
                                        "zp_dtype"},
                                    ww));
  if (w.value("num_bits", Json()) != 4) {
    return Unsupported(ww + ": \"num_bits\" = " + w.value("num_bits", Json()).dump() + "; moekit reads 4-bit weights");
  }
  if (w.value("type", Json()) != "int") {
    return Unsupported(ww + ": \"type\" = " + w.value("type", Json()).dump() + "; moekit reads \"int\" weights");
  }
  if (w.value("symmetric", Json()) != true) {
    return Unsupported(ww + ": \"symmetric\" = " + w.value("symmetric", Json()).dump() +
                       "; moekit reads symmetric int4 (no zero points)");
  }
  if (w.value("strategy", Json()) != "group") {
    return Unsupported(ww + ": \"strategy\" = " + w.value("strategy", Json()).dump() +
                       "; moekit reads \"group\" scales");
  }
  MOEKIT_RETURN_IF_ERROR(only(w, "dynamic", {false}, ww, "moekit reads static weight scales"));
  MOEKIT_RETURN_IF_ERROR(only(w, "actorder", {false}, ww, "activation reordering (g_idx) is not read"));
  MOEKIT_RETURN_IF_ERROR(only(w, "block_structure", {}, ww, "moekit reads group scales, not blocks"));
  MOEKIT_RETURN_IF_ERROR(only(w, "zp_dtype", {}, ww, "symmetric int4 has no zero points"));
  const Json gs = w.value("group_size", Json());
  if (gs == 32) return QuantMethod::kInt4G32;
  if (gs == 128) return QuantMethod::kInt4G128;
  return Unsupported(ww + ": \"group_size\" = " + gs.dump() + "; moekit reads groups of 32 (int4_g32) or 128 (int4_g128)");
}

StatusOr<Activation> activation_of(const Fields& f, const std::string& model_type) {
  if (model_type == "gpt_oss") return Activation::kSwigluOai;  // its experts' own clamped gate (no hidden_act)
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> act, f.string("hidden_act"));
  const std::string a = act.value_or("silu");
  if (a == "silu" || a == "swish") return Activation::kSiluGated;
  if (a == "gelu_pytorch_tanh" || a == "gelu_new" || a == "gelu_fast") return Activation::kGeluGated;
  return Unsupported(f.what() + ": \"hidden_act\" = \"" + a +
                     "\" is not an expert activation moekit runs (silu, or the tanh gelu: gelu_pytorch_tanh)");
}

}  // namespace

Status ModelMoeConfig::moe_layer(int layer) const {
  const std::string at = "layer " + std::to_string(layer);
  if (layer < first_k_dense_replace) {
    return FailedPrecondition(at + " is a dense (non-MoE) layer: first_k_dense_replace = " +
                              std::to_string(first_k_dense_replace) + " makes layers 0.." +
                              std::to_string(first_k_dense_replace - 1) + " dense");
  }
  if (moe_layer_freq > 1 && layer % moe_layer_freq != 0) {
    return FailedPrecondition(at + " is a dense (non-MoE) layer: moe_layer_freq = " + std::to_string(moe_layer_freq));
  }
  for (int l : mlp_only_layers) {
    if (l == layer) return FailedPrecondition(at + " is a dense (non-MoE) layer: it is in mlp_only_layers");
  }
  if (decoder_sparse_step > 1 && (layer + 1) % decoder_sparse_step != 0) {
    return FailedPrecondition(at + " is a dense (non-MoE) layer: decoder_sparse_step = " +
                              std::to_string(decoder_sparse_step) + " puts experts only in layers l with (l + 1) % " +
                              std::to_string(decoder_sparse_step) + " == 0");
  }
  return Status::Ok();
}

StatusOr<ModelMoeConfig> parse_model_config(const Json& j, const std::string& what) {
  if (!j.is_object()) return InvalidArgument(what + ": not a JSON object");
  const Fields f(j, what);
  ModelMoeConfig m;
  MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> type, f.string("model_type"));
  if (!type) return InvalidArgument(what + ": \"model_type\" is missing");
  m.model_type = *type;
  const std::string& t = m.model_type;
  const bool deepseek = t == "deepseek_v3" || t == "glm4_moe";
  const bool qwen = t == "qwen2_moe" || t == "qwen3_moe";
  if (!deepseek && !qwen && t != "mixtral" && t != "gpt_oss") {
    return Unsupported(what + ": model_type \"" + t + "\" is not an MoE family moekit loads (" + kFamilies + ")");
  }
  MoeConfig& c = m.config;
  MOEKIT_ASSIGN_OR_RETURN(const int64_t layers, f.required_integer({"num_hidden_layers"}, 1, kIntMax));
  m.num_layers = static_cast<int>(layers);
  MOEKIT_ASSIGN_OR_RETURN(c.hidden, f.required_integer({"hidden_size"}, 1, int64_t{1} << 24));
  MOEKIT_ASSIGN_OR_RETURN(c.num_experts,
                          f.required_integer({"num_local_experts", "num_experts", "n_routed_experts"}, 1, 32767));
  MOEKIT_ASSIGN_OR_RETURN(const int64_t k, f.required_integer({"num_experts_per_tok", "experts_per_token"}, 1, 32767));
  c.routing.top_k = static_cast<int>(k);
  // Mixtral and gpt-oss size their experts with intermediate_size; the others
  // keep that for their dense MLPs and size experts with moe_intermediate_size.
  if (t == "mixtral" || t == "gpt_oss") {
    MOEKIT_ASSIGN_OR_RETURN(c.intermediate, f.required_integer({"intermediate_size"}, 1, int64_t{1} << 24));
  } else {
    MOEKIT_ASSIGN_OR_RETURN(c.intermediate, f.required_integer({"moe_intermediate_size"}, 1, int64_t{1} << 24));
  }
  MOEKIT_ASSIGN_OR_RETURN(c.activation.kind, activation_of(f, t));
  c.max_num_tokens = 1;

  MOEKIT_ASSIGN_OR_RETURN(std::optional<bool> norm, f.boolean("norm_topk_prob"));
  if (t == "mixtral") {
    c.routing.method = RoutingMethod::kRenormalizeNaive;  // softmax over E, top-k, divided by their sum
  } else if (qwen) {
    // Qwen2-MoE defaults to false, Qwen3-MoE to true (transformers' defaults).
    const bool renorm = norm.value_or(t == "qwen3_moe");
    c.routing.method = renorm ? RoutingMethod::kRenormalizeNaive : RoutingMethod::kSoftmaxTopk;
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> step, f.integer("decoder_sparse_step", 1, kIntMax));
    m.decoder_sparse_step = static_cast<int>(step.value_or(1));
    if (j.contains("mlp_only_layers") && !j.at("mlp_only_layers").is_null()) {
      const Json& list = j.at("mlp_only_layers");
      if (!list.is_array()) return InvalidArgument(what + ": \"mlp_only_layers\" must be a list of layer indices");
      for (const Json& v : list) {
        const std::optional<int64_t> l = json_integer(v, 0, kIntMax);
        if (!l) return InvalidArgument(what + ": \"mlp_only_layers\" must be a list of layer indices");
        m.mlp_only_layers.push_back(static_cast<int>(*l));
      }
    }
    if (t == "qwen2_moe") {
      MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> shared,
                              f.integer("shared_expert_intermediate_size", 0, int64_t{1} << 24));
      c.shared_intermediate = shared.value_or(0);
      c.has_shared_gate = c.shared_intermediate > 0;  // Qwen2-MoE always gates its shared expert
    }
  } else if (deepseek) {
    c.routing.method = RoutingMethod::kDeepseekV3;
    MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> scoring, f.string("scoring_func"));
    if (scoring && *scoring != "sigmoid") {
      return Unsupported(what + ": \"scoring_func\" = \"" + *scoring + "\": moekit's deepseek_v3 routing scores with sigmoid");
    }
    MOEKIT_ASSIGN_OR_RETURN(std::optional<std::string> method, f.string("topk_method"));
    if (method && *method != "noaux_tc") {
      return Unsupported(what + ": \"topk_method\" = \"" + *method + "\": moekit's deepseek_v3 routing is noaux_tc");
    }
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> groups, f.integer("n_group", 1, 32767));
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> kept, f.integer("topk_group", 1, 32767));
    MOEKIT_ASSIGN_OR_RETURN(std::optional<double> scale, f.number("routed_scaling_factor"));
    c.routing.num_groups = static_cast<int>(groups.value_or(1));
    c.routing.topk_groups = static_cast<int>(kept.value_or(1));
    c.routing.routed_scaling_factor = static_cast<float>(scale.value_or(1.0));
    c.routing.renormalize = norm.value_or(true);
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> shared, f.integer("n_shared_experts", 0, 32767));
    c.shared_intermediate = shared.value_or(0) * c.intermediate;  // the shared experts as one MLP
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> dense, f.integer("first_k_dense_replace", 0, kIntMax));
    MOEKIT_ASSIGN_OR_RETURN(std::optional<int64_t> freq, f.integer("moe_layer_freq", 1, kIntMax));
    m.first_k_dense_replace = static_cast<int>(dense.value_or(0));
    m.moe_layer_freq = static_cast<int>(freq.value_or(1));
  } else {  // gpt_oss
    c.routing.method = RoutingMethod::kRenormalize;  // top-k of the logits, softmax over those k
    MOEKIT_ASSIGN_OR_RETURN(std::optional<double> limit, f.number("swiglu_limit"));
    MOEKIT_ASSIGN_OR_RETURN(std::optional<double> alpha, f.number("swiglu_alpha"));
    c.activation.swiglu_limit = static_cast<float>(limit.value_or(7.0));
    c.activation.swiglu_alpha = static_cast<float>(alpha.value_or(1.702));
    c.has_expert_bias = true;
    m.gate_up_order = GateUpOrder::kInterleaved;
    m.fused_transposed = true;
  }
  if (norm && (t == "mixtral" || t == "gpt_oss") && !*norm) {
    return Unsupported(what + ": \"norm_topk_prob\" = false: " + t + " always renormalizes its top-k weights");
  }
  if (j.contains("quantization_config")) {
    const Json& q = j.at("quantization_config");
    if (q.is_object() && q.contains("quant_method") && q.at("quant_method") == "mxfp4") {
      MOEKIT_RETURN_IF_ERROR(check_mxfp4_config(q, what));
      m.mxfp4_experts = true;
    } else if (q.is_object() && q.contains("quant_method") && q.at("quant_method") == "compressed-tensors") {
      MOEKIT_ASSIGN_OR_RETURN(m.int4_scheme, int4_scheme_of(q, what));
    } else {
      MOEKIT_ASSIGN_OR_RETURN(m.fp8_scheme, fp8_scheme_of(q, what));
    }
  }
  return m;
}

}  // namespace moekit::io
