// load_checkpoint_layer (include/moekit/checkpoint.h): config.json ->
// MoeConfig (model_config.h), then the layer's tensors from the shards that
// hold them (io/layer_reader.h, the reader layer files use too).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "io/checkpoint_text.h"
#include "io/file_util.h"
#include "io/json_strict.h"
#include "io/layer_reader.h"
#include "io/model_config.h"
#include "io/tensor_files.h"
#include "moekit/checkpoint.h"
#include "moekit/io.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
StatusOr<std::string> read_text(const std::string& path) {
  io::InputFile f;
  MOEKIT_RETURN_IF_ERROR(io::open_input(path, &f));
  if (f.size > (uint64_t{256} << 20)) return InvalidArgument(path + ": larger than 256 MiB, not a config/index file");
  std::string text(static_cast<size_t>(f.size), '\0');
  MOEKIT_RETURN_IF_ERROR(io::read_exact(f, text.data(), f.size, path));
  return text;
}



// The MoE block prefix of model layer `layer`: what precedes "experts." in its
// names; a dense layer and an unknown naming are named as such.
StatusOr<std::string> moe_prefix(const io::TensorFiles& shards, int layer) {
  std::set<std::string> prefixes;
  std::vector<std::string> in;
  for (const auto& [name, file] : shards.names()) {
    if (!io::in_model_layer(name, layer)) continue;
    in.push_back(name);
    const size_t at = ("." + name).find(".experts.");
    if (at != std::string::npos) prefixes.insert(name.substr(0, at));
  }
  const std::string where = "layers." + std::to_string(layer) + ".";
  if (in.empty()) return NotFound("no tensor under '" + where + "' in the weight files");
  if (prefixes.size() > 1) {
    return InvalidArgument("several expert groups under '" + where + "': " +
                           io::list_names(std::vector<std::string>(prefixes.begin(), prefixes.end())));
  }
  if (prefixes.empty()) {
    for (const std::string& n : in) {
      if (n.ends_with("mlp.gate_proj.weight") || n.ends_with("mlp.down_proj.weight")) {
        return FailedPrecondition("layer " + std::to_string(layer) + " is a dense (non-MoE) layer: its MLP is " +
                                  n.substr(0, n.size() - 16) + "{gate,up,down}_proj, without experts");
      }
    }
    std::vector<std::string> shown;
    for (const std::string& n : in) {
      if (n.find("attn") == std::string::npos && n.find("norm") == std::string::npos) shown.push_back(n);
    }
    return InvalidArgument("no MoE naming recognised under '" + where + "' (docs/layer_files.md lists them); names "
                           "found there besides attention and norms: " + io::list_names(shown.empty() ? in : shown));
  }
  return *prefixes.begin();
}

}  // namespace

MoeWeights CheckpointLayer::weights() const {
  auto opt = [](const HostTensor& t) { return t.shape().empty() ? TensorView{} : t.view(); };
  MoeWeights w;
  w.w13 = w13.view();
  w.w2 = w2.view();
  w.score_bias = opt(score_bias);
  w.w13_bias = opt(w13_bias);
  w.w2_bias = opt(w2_bias);
  w.shared_w13 = opt(shared_w13);
  w.shared_w2 = opt(shared_w2);
  w.shared_gate = opt(shared_gate);
  w.w13_scale = opt(w13_scale);
  w.w2_scale = opt(w2_scale);
  w.a13_scale = opt(a13_scale);
  w.a2_scale = opt(a2_scale);
  return w;
}

std::string CheckpointLayer::summary() const {
  std::ostringstream os;
  if (!model_type.empty()) {
    os << "model:    " << model_type << ", layer " << layer << " of " << num_layers << ", prefix '" << prefix << "'\n";
  }
  os << "experts:  " << naming << ": E=" << config.num_experts << ", H=" << config.hidden
     << ", I=" << config.intermediate << ", "
     << (config.quant.method != QuantMethod::kNone ? config.quant.to_string()
                                                   : std::string(dtype_name(config.quant.weight_dtype)))
     << (config.has_expert_bias ? ", with biases" : "") << "\n";
  if (config.shared_intermediate > 0) {
    os << "shared:   one shared expert of width " << config.shared_intermediate
       << (config.has_shared_gate ? ", sigmoid-gated" : "") << "\n";
  }
  os << "router:   " << (router_weight.shape().empty() ? "none (logits must be given)" : "weight")
     << (router_bias.shape().empty() ? "" : " + bias") << (score_bias.shape().empty() ? "" : ", selection bias") << "\n";
  os << "files:   ";
  for (const std::string& f : files) os << " " << f;
  return os.str();
}

StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer) {
  return load_checkpoint_layer(model_dir, layer, CheckpointLoadOptions{});
}

namespace {

// config.json's text and the model's tensors -> layer `layer`: what the
// folder and the in-memory forms share.
StatusOr<CheckpointLayer> load_layer_of(const std::string& config_text, const std::string& config_what,
                                        io::TensorFiles& tensors, int layer, const CheckpointLoadOptions& options) {
  MOEKIT_ASSIGN_OR_RETURN(const nlohmann::json j, io::parse_json_strict(config_text, config_what));
  MOEKIT_ASSIGN_OR_RETURN(io::ModelMoeConfig model, io::parse_model_config(j, config_what));
  if (layer < 0 || layer >= model.num_layers) {
    return OutOfRange("layer " + std::to_string(layer) + ": the model has " + std::to_string(model.num_layers) +
                      " layers (0.." + std::to_string(model.num_layers - 1) + ", num_hidden_layers)");
  }
  MOEKIT_RETURN_IF_ERROR(model.moe_layer(layer));
  MOEKIT_ASSIGN_OR_RETURN(const std::string prefix, moe_prefix(tensors, layer));
  CheckpointLayer out;
  out.config = model.config;
  out.model_type = model.model_type;
  out.layer = layer;
  out.num_layers = model.num_layers;
  MOEKIT_RETURN_IF_ERROR(
      io::read_moe_block(tensors, &model, prefix, options.check_size, &out, options.keep_packed_weights));
  if (model.fp8_scheme && (out.config.quant.method != *model.fp8_scheme)) {
    return InvalidArgument(config_what + ": \"quantization_config\" says " + quant_method_name(*model.fp8_scheme) +
                           ", but the experts under '" + prefix + "' are " +
                           (out.config.quant.is_fp8() ? quant_method_name(out.config.quant.method)
                                                      : dtype_name(out.config.quant.weight_dtype)));
  }
  if (!model.fp8_scheme && out.config.quant.is_fp8()) {
    return InvalidArgument(config_what + ": F8_E4M3 experts under '" + prefix +
                           "', but no \"quantization_config\" says so");
  }
  // 4-bit experts: compressed-tensors' int4 scheme, or gpt-oss's mxfp4 (kept
  // packed, or dequantized to bf16), and only where the config says so.
  const QuantMethod got = out.config.quant.method;
  const auto got_text = [&] {
    return std::string(out.config.quant.method != QuantMethod::kNone ? quant_method_name(got)
                                                                     : dtype_name(out.config.quant.weight_dtype));
  };
  if (model.int4_scheme && got != *model.int4_scheme) {
    return InvalidArgument(config_what + ": \"quantization_config\" says compressed-tensors " +
                           quant_method_name(*model.int4_scheme) + ", but the experts under '" + prefix + "' are " +
                           got_text());
  }
  if (!model.int4_scheme && out.config.quant.is_weight4() && !(model.mxfp4_experts && got == QuantMethod::kMxfp4)) {
    return InvalidArgument(config_what + ": " + got_text() + " experts under '" + prefix +
                           "', but no \"quantization_config\" says so");
  }
  out.files = tensors.files_used();
  MOEKIT_RETURN_IF_ERROR(out.config.validate());
  return out;
}

}  // namespace

StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer,
                                                const std::function<Status(const CheckpointLayerSize&)>& check_size) {
  CheckpointLoadOptions options;
  options.check_size = check_size;
  return load_checkpoint_layer(model_dir, layer, options);
}

StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer,
                                                const CheckpointLoadOptions& options) {
  const std::string config_path = model_dir + "/config.json";
  std::error_code ec;
  if (model_dir.empty()) return InvalidArgument("the model folder path is empty");
  if (!fs::is_directory(model_dir, ec)) return NotFound(model_dir + ": not a folder");
  if (!fs::exists(config_path, ec)) {
    return NotFound(model_dir + ": no config.json (a model folder as save_pretrained writes it)");
  }
  MOEKIT_ASSIGN_OR_RETURN(const std::string text, read_text(config_path));
  MOEKIT_ASSIGN_OR_RETURN(io::TensorFiles shards, io::TensorFiles::open_folder(model_dir));
  return load_layer_of(text, config_path, shards, layer, options);
}

StatusOr<MoeConfig> checkpoint_layer_config(const std::string& config_json, int layer) {
  MOEKIT_ASSIGN_OR_RETURN(const nlohmann::json j, io::parse_json_strict(config_json, "config"));
  MOEKIT_ASSIGN_OR_RETURN(io::ModelMoeConfig model, io::parse_model_config(j, "config"));
  if (layer < 0 || layer >= model.num_layers) {
    return OutOfRange("layer " + std::to_string(layer) + ": the model has " + std::to_string(model.num_layers) +
                      " layers (0.." + std::to_string(model.num_layers - 1) + ", num_hidden_layers)");
  }
  MOEKIT_RETURN_IF_ERROR(model.moe_layer(layer));
  return model.config;
}

StatusOr<CheckpointLayer> load_checkpoint_layer_in_memory(const std::string& config_json, io::SafetensorsFile tensors,
                                                          int layer) {
  return load_checkpoint_layer_in_memory(config_json, std::move(tensors), layer, CheckpointLoadOptions{});
}

StatusOr<CheckpointLayer> load_checkpoint_layer_in_memory(const std::string& config_json, io::SafetensorsFile tensors,
                                                          int layer, const CheckpointLoadOptions& options) {
  io::TensorFiles files = io::TensorFiles::of_file(std::move(tensors));
  return load_layer_of(config_json, "config", files, layer, options);
}

std::vector<std::string> model_folder_files(const std::string& model_dir) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  const auto add = [&](const std::string& name) {
    std::error_code ec;
    const std::string path = model_dir + "/" + name;
    if (seen.insert(name).second && fs::is_regular_file(path, ec)) out.push_back(path);
  };
  add("config.json");
  add("model.safetensors");
  add("model.safetensors.index.json");
  const std::string index = model_dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (!fs::is_regular_file(index, ec)) return out;
  StatusOr<std::string> text = read_text(index);
  if (!text.ok()) return out;
  StatusOr<nlohmann::json> j = io::parse_json_strict(*text, index);
  if (!j.ok() || !j->is_object() || !j->contains("weight_map") || !j->at("weight_map").is_object()) return out;
  for (const auto& [name, file] : j->at("weight_map").items()) {
    if (file.is_string() && file.get<std::string>().find('/') == std::string::npos && !file.get<std::string>().empty()) {
      add(file.get<std::string>());
    }
  }
  return out;
}

StatusOr<HostTensor> checkpoint_router_logits(const CheckpointLayer& layer, const TensorView& hidden) {
  if (layer.router_weight.shape().empty()) {
    return FailedPrecondition(layer.prefix + ": the checkpoint has no router weight (gate.weight / router.weight)");
  }
  const int64_t E = layer.config.num_experts, H = layer.config.hidden;
  MOEKIT_RETURN_IF_ERROR(check_tensor(hidden, "hidden", {DType::kF32, DType::kBF16, DType::kF16}, {-1, H},
                                      Device::cpu()));
  const int64_t M = hidden.dim(0);
  MOEKIT_ASSIGN_OR_RETURN(HostTensor x, io::convert(hidden, DType::kF32));
  HostTensor logits(DType::kF32, {M, E});
  const float* w = layer.router_weight.data<float>();
  const float* b = layer.router_bias.shape().empty() ? nullptr : layer.router_bias.data<float>();
  for (int64_t t = 0; t < M; ++t) {
    const float* xt = x.data<float>() + t * H;
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += xt[h] * w[e * H + h];
      logits.data<float>()[t * E + e] = b != nullptr ? acc + b[e] : acc;
    }
  }
  return logits;
}

}  // namespace moekit
