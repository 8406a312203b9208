// load_checkpoint_layer (include/moekit/checkpoint.h): config.json ->
// MoeConfig (model_config.h), then the layer's tensors from the shards that
// hold them, under whichever naming the folder uses (docs/layer_files.md).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "io/file_util.h"
#include "io/json_strict.h"
#include "io/model_config.h"
#include "moekit/checkpoint.h"
#include "moekit/io.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using io::SafetensorsEntry;
using io::SafetensorsFile;

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

StatusOr<std::string> read_text(const std::string& path) {
  io::InputFile f;
  MOEKIT_RETURN_IF_ERROR(io::open_input(path, &f));
  if (f.size > (uint64_t{256} << 20)) return InvalidArgument(path + ": larger than 256 MiB, not a config/index file");
  std::string text(static_cast<size_t>(f.size), '\0');
  MOEKIT_RETURN_IF_ERROR(io::read_exact(f, text.data(), f.size, path));
  return text;
}

// The folder's tensors: which shard holds each name; shards opened (mapped) on
// first use, so only the shards of the asked layer are touched.
class Shards {
 public:
  static StatusOr<Shards> open(const std::string& dir) {
    Shards s;
    s.dir_ = dir;
    const std::string index = dir + "/model.safetensors.index.json";
    const std::string single = dir + "/model.safetensors";
    std::error_code ec;
    if (fs::exists(index, ec)) {
      MOEKIT_ASSIGN_OR_RETURN(const std::string text, read_text(index));
      MOEKIT_ASSIGN_OR_RETURN(const nlohmann::json j, io::parse_json_strict(text, index));
      if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
        return InvalidArgument(index + ": no \"weight_map\" object (tensor name -> shard file)");
      }
      for (const auto& [name, file] : j.at("weight_map").items()) {
        if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
          return InvalidArgument(index + ": weight_map[\"" + name + "\"] must be a shard file name in the folder");
        }
        s.where_[name] = file.get<std::string>();
      }
    } else if (fs::exists(single, ec)) {
      MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single));
      for (const SafetensorsEntry& e : file.entries()) s.where_[e.name] = "model.safetensors";
      s.open_.emplace("model.safetensors", std::move(file));
    } else {
      return NotFound(dir + ": no model.safetensors or model.safetensors.index.json (safetensors weights as "
                            "save_pretrained writes them)");
    }
    return s;
  }

  const std::map<std::string, std::string>& names() const { return where_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }

  StatusOr<const SafetensorsEntry*> entry(const std::string& name) {
    MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, shard_of(name));
    const SafetensorsEntry* e = f->find(name);
    if (e == nullptr) return DataLoss(f->path() + ": the index lists " + name + " in this shard, but it is not there");
    return e;
  }
  StatusOr<HostTensor> read(const std::string& name) {
    MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, shard_of(name));
    return f->read(name);
  }
  std::vector<std::string> files_used() const {
    std::vector<std::string> out;
    for (const auto& [file, unused] : open_) out.push_back(file);
    return out;
  }

 private:
  StatusOr<SafetensorsFile*> shard_of(const std::string& name) {
    auto w = where_.find(name);
    if (w == where_.end()) return NotFound(dir_ + ": no tensor " + name);
    auto it = open_.find(w->second);
    if (it == open_.end()) {
      MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir_ + "/" + w->second));
      it = open_.emplace(w->second, std::move(f)).first;
    }
    return &it->second;
  }

  std::string dir_;
  std::map<std::string, std::string> where_;   // tensor name -> shard file
  std::map<std::string, SafetensorsFile> open_;  // shard file -> mapping
};

bool in_layer(const std::string& name, int layer) {
  return ("." + name).find(".layers." + std::to_string(layer) + ".") != std::string::npos;
}

std::string list_names(const std::vector<std::string>& names, size_t most = 24) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

// Loads the tensors under one MoE block prefix into `out`.
class LayerReader {
 public:
  LayerReader(Shards& shards, const io::ModelMoeConfig& model, std::string prefix, CheckpointLayer* out)
      : shards_(shards), model_(model), p_(std::move(prefix)), out_(out) {}

  Status read_experts() {
    const MoeConfig& c = model_.config;
    const std::string fused_gate_up = p_ + "experts.gate_up_proj", fused_down = p_ + "experts.down_proj";
    const bool fused = shards_.contains(fused_gate_up) || shards_.contains(fused_down);
    const bool per_expert = has(p_ + "experts.0.gate_proj.weight") || has(p_ + "experts.0.w1.weight");
    if (fused && per_expert) {
      return InvalidArgument(p_ + "experts: both fused (experts.gate_up_proj) and per-expert tensors; which is meant?");
    }
    // Every per-expert name must be one of the config's experts, spelled one
    // way: "experts.03." or a 7-digit index would otherwise be skipped silently
    // (the layer-file reader refuses them too, tools/layer_names.h).
    const std::string experts = p_ + "experts.";
    for (const std::string& n : names_under(experts)) {
      const std::string seg = n.substr(experts.size(), n.find('.', experts.size()) - experts.size());
      if (seg.empty() || seg.find_first_not_of("0123456789") != std::string::npos) continue;
      if (fused) {
        return InvalidArgument(n + ": a per-expert tensor beside the fused " + fused_gate_up + "; which is meant?");
      }
      if (seg.size() <= 9 && seg[0] != '0' && std::stoll(seg) >= c.num_experts) {
        return InvalidArgument(n + ": an expert past the " + std::to_string(c.num_experts) + " of config.json");
      }
      if ((seg.size() > 1 && seg[0] == '0') || seg.size() > 9) {
        return InvalidArgument(n + ": expert index '" + seg + "' is not one of the " + std::to_string(c.num_experts) +
                               " experts of config.json (0.." + std::to_string(c.num_experts - 1) +
                               ", without leading zeros)");
      }
    }
    if (fused) return read_fused(c.num_experts, c.hidden, c.intermediate);
    if (per_expert) return read_per_expert(c.num_experts, c.hidden, c.intermediate);
    return InvalidArgument("no expert naming recognised under '" + p_ + "experts.'; names found there: " +
                           list_names(names_under(p_ + "experts.")));
  }

  Status read_router() {
    const int64_t E = model_.config.num_experts, H = model_.config.hidden;
    MOEKIT_ASSIGN_OR_RETURN(out_->router_weight, optional_f32({p_ + "gate.weight", p_ + "router.weight"}, {E, H}));
    MOEKIT_ASSIGN_OR_RETURN(out_->router_bias, optional_f32({p_ + "router.bias", p_ + "gate.bias"}, {E}));
    MOEKIT_ASSIGN_OR_RETURN(out_->score_bias,
                            optional_f32({p_ + "gate.e_score_correction_bias", p_ + "e_score_correction_bias"}, {E}));
    if (!out_->score_bias.shape().empty()) {
      if (model_.config.routing.method != RoutingMethod::kDeepseekV3) {
        return InvalidArgument(p_ + "...e_score_correction_bias: a selection bias, but " + model_.model_type +
                               " routing has none");
      }
      out_->config.routing.has_score_bias = true;
    }
    return Status::Ok();
  }

  Status read_shared() {
    MoeConfig& c = out_->config;
    const int64_t H = c.hidden, Is = c.shared_intermediate;
    std::string sp;  // shared expert prefix
    for (const char* s : {"shared_experts.", "shared_expert."}) {
      if (has(p_ + s + "gate_proj.weight") || has(p_ + s + "down_proj.weight")) sp = p_ + s;
    }
    if (Is == 0) {
      if (!sp.empty()) {
        return InvalidArgument(sp + "*: shared expert tensors, but config.json sets no shared expert "
                                    "(n_shared_experts / shared_expert_intermediate_size)");
      }
      return Status::Ok();
    }
    if (sp.empty()) {
      return NotFound(p_ + "shared_experts.{gate,up,down}_proj.weight (or shared_expert.*) missing: config.json "
                           "sets a shared expert of width " + std::to_string(Is));
    }
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g, need(sp + "gate_proj.weight", {Is, H}));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* u, need(sp + "up_proj.weight", {Is, H}));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* d, need(sp + "down_proj.weight", {H, Is}));
    for (const SafetensorsEntry* e : {g, u, d}) MOEKIT_RETURN_IF_ERROR(same_dtype(*e));
    out_->shared_w13 = HostTensor(dtype_, {2 * Is, H});
    MOEKIT_RETURN_IF_ERROR(copy_into(g->name, out_->shared_w13, 0));
    MOEKIT_RETURN_IF_ERROR(copy_into(u->name, out_->shared_w13, Is * H));
    MOEKIT_ASSIGN_OR_RETURN(out_->shared_w2, shards_.read(d->name));
    if (c.has_shared_gate) {
      MOEKIT_ASSIGN_OR_RETURN(HostTensor gate, optional_f32({p_ + "shared_expert_gate.weight"}, {1, H}));
      if (gate.shape().empty()) return NotFound(p_ + "shared_expert_gate.weight [1, " + std::to_string(H) + "] missing");
      out_->shared_gate = HostTensor(DType::kF32, {H});
      std::memcpy(out_->shared_gate.data<float>(), gate.data<float>(), sizeof(float) * H);
    }
    return Status::Ok();
  }

  DType dtype() const { return dtype_; }

 private:
  bool has(const std::string& n) const { return shards_.contains(n); }

  std::vector<std::string> names_under(const std::string& prefix) const {
    std::vector<std::string> v;
    for (auto it = shards_.names().lower_bound(prefix); it != shards_.names().end() && it->first.starts_with(prefix);
         ++it) {
      v.push_back(it->first);
    }
    return v;
  }

  // A required tensor of this exact shape, bf16 or f32.
  StatusOr<const SafetensorsEntry*> need(const std::string& name, const std::vector<int64_t>& shape,
                                         const std::string& why = "") {
    if (!has(name)) return NotFound(name + " is missing" + why);
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, shards_.entry(name));
    if (e->dtype != DType::kBF16 && e->dtype != DType::kF32) {
      return InvalidArgument(name + ": dtype " + e->dtype_name + " (moekit loads BF16 or F32 weights)");
    }
    if (e->shape != shape) {
      return InvalidArgument(name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(shape) +
                             " from config.json");
    }
    return e;
  }

  // The expert weights' dtype is the first one seen; every weight shares it.
  Status same_dtype(const SafetensorsEntry& e) {
    if (!dtype_set_) {
      dtype_ = *e.dtype;
      dtype_set_ = true;
    } else if (*e.dtype != dtype_) {
      return InvalidArgument(e.name + ": dtype " + e.dtype_name + " differs from the layer's other weights (" +
                             dtype_name(dtype_) + ")");
    }
    return Status::Ok();
  }

  // Copies tensor `name` into dst at element offset `at`.
  Status copy_into(const std::string& name, HostTensor& dst, int64_t at) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t, shards_.read(name));
    std::memcpy(dst.data<unsigned char>() + at * dtype_size(dst.dtype()), t.data<unsigned char>(), t.nbytes());
    return Status::Ok();
  }

  StatusOr<HostTensor> optional_f32(const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
    for (const std::string& n : names) {
      if (!has(n)) continue;
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, need(n, shape));
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t, shards_.read(e->name));
      return io::convert(t.view(), DType::kF32);
    }
    return HostTensor();
  }

  Status read_per_expert(int64_t E, int64_t H, int64_t I) {
    const bool mixtral = has(p_ + "experts.0.w1.weight");
    const char* names[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
    out_->naming = mixtral ? "experts.<e>.{w1,w3,w2}.weight" : "experts.<e>.{gate,up,down}_proj.weight";
    const std::string experts = p_ + "experts.";
    for (const std::string& n : names_under(experts)) {  // every index must be one of the config's E
      const std::string digits = n.substr(experts.size(), n.find('.', experts.size()) - experts.size());
      if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (std::stoll(digits) >= E) {
        return InvalidArgument(n + ": an expert past the " + std::to_string(E) + " of config.json");
      }
    }
    std::vector<const SafetensorsEntry*> parts;  // [E][3], all checked before anything is read
    for (int64_t e = 0; e < E; ++e) {
      const std::string base = p_ + "experts." + std::to_string(e) + ".";
      const std::vector<int64_t> shapes[3] = {{I, H}, {I, H}, {H, I}};
      for (int p = 0; p < 3; ++p) {
        MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* x, need(base + names[p] + ".weight", shapes[p]));
        MOEKIT_RETURN_IF_ERROR(same_dtype(*x));
        parts.push_back(x);
      }
    }
    out_->w13 = HostTensor(dtype_, {E, 2 * I, H});
    out_->w2 = HostTensor(dtype_, {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[3 * e]->name, out_->w13, e * 2 * I * H));          // gate rows
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[3 * e + 1]->name, out_->w13, (e * 2 + 1) * I * H));  // up rows
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[3 * e + 2]->name, out_->w2, e * H * I));
    }
    return Status::Ok();
  }

  // Which of [E, a, b] / [E, b, a] a fused tensor is; `transposed_if_square`
  // decides when a == b (the family's own layout).
  StatusOr<bool> fused_transposed(const std::string& name, int64_t E, int64_t a, int64_t b) {
    if (!has(name)) return NotFound(name + " is missing (the fused naming needs both gate_up_proj and down_proj)");
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, shards_.entry(name));
    const std::vector<int64_t> plain = {E, a, b}, transposed = {E, b, a};
    if (e->shape == plain && (a != b || !model_.fused_transposed)) return false;
    if (e->shape == transposed) return true;
    return InvalidArgument(name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(plain) + " or " +
                           shape_text(transposed) + " from config.json");
  }

  // t [E, r, c] -> [E, c, r]
  static HostTensor transpose_last(const HostTensor& t) {
    const int64_t E = t.shape()[0], r = t.shape()[1], c = t.shape()[2];
    HostTensor out(t.dtype(), {E, c, r});
    const size_t el = dtype_size(t.dtype());
    const unsigned char* src = t.data<unsigned char>();
    unsigned char* dst = out.data<unsigned char>();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < c; ++j) std::memcpy(dst + ((e * c + j) * r + i) * el, src + ((e * r + i) * c + j) * el, el);
      }
    }
    return out;
  }

  Status read_fused(int64_t E, int64_t H, int64_t I) {
    const std::string gu = p_ + "experts.gate_up_proj", dn = p_ + "experts.down_proj";
    MOEKIT_ASSIGN_OR_RETURN(const bool gu_t, fused_transposed(gu, E, 2 * I, H));
    MOEKIT_ASSIGN_OR_RETURN(const bool dn_t, fused_transposed(dn, E, H, I));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g, need(gu, gu_t ? std::vector<int64_t>{E, H, 2 * I}
                                                                      : std::vector<int64_t>{E, 2 * I, H}));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* d,
                            need(dn, dn_t ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, I}));
    MOEKIT_RETURN_IF_ERROR(same_dtype(*g));
    MOEKIT_RETURN_IF_ERROR(same_dtype(*d));
    const bool interleaved = model_.gate_up_order == io::GateUpOrder::kInterleaved;
    out_->naming = std::string("experts.{gate_up_proj") + (gu_t ? " [E, H, 2I]" : " [E, 2I, H]") +
                   (interleaved ? " interleaved" : "") + ", down_proj" + (dn_t ? " [E, I, H]" : " [E, H, I]") + "}";
    MOEKIT_ASSIGN_OR_RETURN(HostTensor w13, shards_.read(gu));
    MOEKIT_ASSIGN_OR_RETURN(HostTensor w2, shards_.read(dn));
    // Rows keep their order: chunked rows are moekit's gated layout, interleaved
    // rows are swiglu_oai's (kernel.h), which is the only activation such families use.
    out_->w13 = gu_t ? transpose_last(w13) : std::move(w13);
    out_->w2 = dn_t ? transpose_last(w2) : std::move(w2);
    const std::string gub = gu + "_bias", dnb = dn + "_bias";
    if (model_.config.has_expert_bias || has(gub) || has(dnb)) {
      const std::string why = " (the experts' biases, which " + model_.model_type + " has)";
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* b1, need(gub, {E, 2 * I}, why));
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* b2, need(dnb, {E, H}, why));
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t1, shards_.read(b1->name));
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t2, shards_.read(b2->name));
      MOEKIT_ASSIGN_OR_RETURN(out_->w13_bias, io::convert(t1.view(), DType::kF32));
      MOEKIT_ASSIGN_OR_RETURN(out_->w2_bias, io::convert(t2.view(), DType::kF32));
      out_->config.has_expert_bias = true;
    }
    return Status::Ok();
  }

  Shards& shards_;
  const io::ModelMoeConfig& model_;
  std::string p_;
  CheckpointLayer* out_;
  DType dtype_ = DType::kBF16;
  bool dtype_set_ = false;
};

// The MoE block prefix of model layer `layer`: what precedes "experts." in its
// names; a dense layer and an unknown naming are named as such.
StatusOr<std::string> moe_prefix(const Shards& shards, int layer) {
  std::set<std::string> prefixes;
  std::vector<std::string> in;
  for (const auto& [name, file] : shards.names()) {
    if (!in_layer(name, layer)) continue;
    in.push_back(name);
    const size_t at = ("." + name).find(".experts.");
    if (at != std::string::npos) prefixes.insert(name.substr(0, at));
  }
  const std::string where = "layers." + std::to_string(layer) + ".";
  if (in.empty()) return NotFound("no tensor under '" + where + "' in the weight files");
  if (prefixes.size() > 1) {
    return InvalidArgument("several expert groups under '" + where + "': " +
                           list_names(std::vector<std::string>(prefixes.begin(), prefixes.end())));
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
                           "found there besides attention and norms: " + list_names(shown.empty() ? in : shown));
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
  return w;
}

std::string CheckpointLayer::summary() const {
  std::ostringstream os;
  os << "model:    " << model_type << ", layer " << layer << " of " << num_layers << ", prefix '" << prefix << "'\n";
  os << "experts:  " << naming << ": E=" << config.num_experts << ", H=" << config.hidden
     << ", I=" << config.intermediate << ", " << dtype_name(config.quant.weight_dtype)
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
  return load_checkpoint_layer(model_dir, layer, {});
}

StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer,
                                                const std::function<Status(const CheckpointLayerSize&)>& check_size) {
  const std::string config_path = model_dir + "/config.json";
  std::error_code ec;
  if (model_dir.empty()) return InvalidArgument("the model folder path is empty");
  if (!fs::is_directory(model_dir, ec)) return NotFound(model_dir + ": not a folder");
  if (!fs::exists(config_path, ec)) {
    return NotFound(model_dir + ": no config.json (a model folder as save_pretrained writes it)");
  }
  MOEKIT_ASSIGN_OR_RETURN(const std::string text, read_text(config_path));
  MOEKIT_ASSIGN_OR_RETURN(const nlohmann::json j, io::parse_json_strict(text, config_path));
  MOEKIT_ASSIGN_OR_RETURN(io::ModelMoeConfig model, io::parse_model_config(j, config_path));
  if (layer < 0 || layer >= model.num_layers) {
    return OutOfRange("layer " + std::to_string(layer) + ": the model has " + std::to_string(model.num_layers) +
                      " layers (0.." + std::to_string(model.num_layers - 1) + ", num_hidden_layers)");
  }
  MOEKIT_RETURN_IF_ERROR(model.moe_layer(layer));
  MOEKIT_ASSIGN_OR_RETURN(Shards shards, Shards::open(model_dir));
  MOEKIT_ASSIGN_OR_RETURN(const std::string prefix, moe_prefix(shards, layer));

  if (check_size) {
    // From the headers alone: every tensor under the prefix, and the experts' dtype.
    CheckpointLayerSize size;
    size.config = model.config;
    size.w13_rows = model.config.activation.gated() ? 2 * model.config.intermediate : model.config.intermediate;
    bool dtype_seen = false;
    for (auto it = shards.names().lower_bound(prefix); it != shards.names().end() && it->first.starts_with(prefix);
         ++it) {
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, shards.entry(it->first));
      size.tensor_bytes += e->nbytes;
      if (!dtype_seen && e->dtype && it->first.find("experts.") != std::string::npos) {
        size.dtype = *e->dtype;
        dtype_seen = true;
      }
    }
    MOEKIT_RETURN_IF_ERROR(check_size(size));
  }

  CheckpointLayer out;
  out.config = model.config;
  out.model_type = model.model_type;
  out.layer = layer;
  out.num_layers = model.num_layers;
  out.prefix = prefix;
  LayerReader reader(shards, model, prefix, &out);
  MOEKIT_RETURN_IF_ERROR(reader.read_experts());
  MOEKIT_RETURN_IF_ERROR(reader.read_router());
  MOEKIT_RETURN_IF_ERROR(reader.read_shared());
  out.config.quant.weight_dtype = reader.dtype();
  out.config.quant.act_dtype = reader.dtype();
  out.files = shards.files_used();
  MOEKIT_RETURN_IF_ERROR(out.config.validate());
  return out;
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
