#include "layer_weights.h"

#include <array>
#include <cstring>
#include <map>
#include <vector>

#include "layer_names.h"

namespace moekit::tools {
namespace {

// The projections of one expert found in the file.
struct ExpertTensors {
  const io::SafetensorsEntry* gate = nullptr;  // [I, H]
  const io::SafetensorsEntry* up = nullptr;    // [I, H]
  const io::SafetensorsEntry* down = nullptr;  // [H, I]
};

struct Candidate {
  std::string naming;
  std::map<int64_t, ExpertTensors> experts;  // per-expert namings only
};

bool in_layer(const std::string& prefix, int layer) {
  return ("." + prefix).find(".layers." + std::to_string(layer) + ".") != std::string::npos;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Status check_float(const io::SafetensorsEntry& e) {
  if (e.dtype != DType::kBF16 && e.dtype != DType::kF32) {
    return InvalidArgument(e.name + ": weights must be BF16 or F32, got " + e.dtype_name);
  }
  return Status::Ok();
}

Status check_weight_dtype(const io::SafetensorsEntry& e) {
  if (e.dtype != DType::kBF16 && e.dtype != DType::kF32 && e.dtype != DType::kF8E4M3) {
    return InvalidArgument(e.name + ": weights must be BF16, F32 or F8_E4M3, got " + e.dtype_name);
  }
  return Status::Ok();
}

// A scale next to an unquantized weight would be silently ignored: refuse it.
Status check_no_scale(const io::SafetensorsFile& file, const io::SafetensorsEntry& w) {
  const std::string base = w.name.substr(0, w.name.size() - std::string(".weight").size());
  for (const char* suffix : {".weight_scale_inv", ".weight_scale", ".input_scale"}) {
    if (file.contains(base + suffix)) {
      return InvalidArgument(base + suffix + ": a scale for " + w.name + ", which is " + w.dtype_name +
                             ", not F8_E4M3");
    }
  }
  return Status::Ok();
}

// Reads an optional tensor as f32 with the given shape.
StatusOr<HostTensor> optional_f32(const io::SafetensorsFile& file, const std::vector<std::string>& names,
                                  const std::vector<int64_t>& shape) {
  for (const std::string& n : names) {
    const io::SafetensorsEntry* e = file.find(n);
    if (e == nullptr) continue;
    MOEKIT_RETURN_IF_ERROR(check_float(*e));
    if (e->shape != shape) {
      return InvalidArgument(n + ": expected shape " + shape_text(shape) + ", got " + shape_text(e->shape));
    }
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t, file.read(n));
    return io::convert(t.view(), DType::kF32);
  }
  return HostTensor();
}

// Stacks per-expert projections into w13 [E, 2I, H] and w2 [E, H, I]. Every
// expert is checked before anything is allocated.
Status stack_experts(const io::SafetensorsFile& file, const std::string& prefix, const Candidate& c,
                     const LayerSizeCheck& check_size, LayerCheckpoint* out) {
  const int64_t E = c.experts.rbegin()->first + 1;
  const bool mixtral = c.naming == "w1/w3/w2";
  const char* names[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
  for (int64_t e = 0; e < E; ++e) {
    auto it = c.experts.find(e);
    if (it == c.experts.end()) return InvalidArgument(prefix + "experts." + std::to_string(e) + ": expert missing");
    const ExpertTensors& x = it->second;
    const io::SafetensorsEntry* parts[3] = {x.gate, x.up, x.down};
    for (int p = 0; p < 3; ++p) {
      if (parts[p] == nullptr) {
        return InvalidArgument(prefix + "experts." + std::to_string(e) + "." + names[p] + ".weight is missing");
      }
    }
  }
  const io::SafetensorsEntry& g0 = *c.experts.at(0).gate;
  MOEKIT_RETURN_IF_ERROR(check_weight_dtype(g0));
  if (g0.shape.size() != 2) return InvalidArgument(g0.name + ": expected [I, H], got " + shape_text(g0.shape));
  const int64_t I = g0.shape[0], H = g0.shape[1];
  const DType dtype = *g0.dtype;
  for (int64_t e = 0; e < E; ++e) {
    const ExpertTensors& x = c.experts.at(e);
    const std::pair<const io::SafetensorsEntry*, std::vector<int64_t>> want[3] = {
        {x.gate, {I, H}}, {x.up, {I, H}}, {x.down, {H, I}}};
    for (const auto& [entry, shape] : want) {
      MOEKIT_RETURN_IF_ERROR(check_weight_dtype(*entry));
      if (entry->shape != shape) {
        return InvalidArgument(entry->name + ": expected " + shape_text(shape) + " (as expert 0), got " +
                               shape_text(entry->shape));
      }
      if (entry->dtype != dtype) {
        return InvalidArgument(entry->name + ": dtype " + entry->dtype_name + " differs from expert 0's " +
                               g0.dtype_name);
      }
    }
  }
  // fp8: every scale read and checked before the weights are stacked.
  std::vector<std::array<const io::SafetensorsEntry*, 3>> parts;
  for (int64_t e = 0; e < E; ++e) {
    const ExpertTensors& x = c.experts.at(e);
    parts.push_back({x.gate, x.up, x.down});
    if (dtype != DType::kF8E4M3) {
      for (const io::SafetensorsEntry* p : parts.back()) MOEKIT_RETURN_IF_ERROR(check_no_scale(file, *p));
    }
  }
  if (dtype == DType::kF8E4M3) {
    MOEKIT_ASSIGN_OR_RETURN(out->fp8, read_expert_fp8_scales(file, parts, I, H));
  }
  // Every expert's tensors lie in the file without overlapping, so these sizes fit.
  if (check_size) MOEKIT_RETURN_IF_ERROR(check_size(LayerSize{E, 2 * I, H, I, dtype}));
  out->w13 = HostTensor(dtype, {E, 2 * I, H});
  out->w2 = HostTensor(dtype, {E, H, I});
  const size_t el = dtype_size(dtype);
  for (int64_t e = 0; e < E; ++e) {
    const ExpertTensors& x = c.experts.at(e);
    const io::SafetensorsEntry* parts[3] = {x.gate, x.up, x.down};
    unsigned char* dst[3] = {out->w13.data<unsigned char>() + static_cast<size_t>(e * 2 * I * H) * el,
                             out->w13.data<unsigned char>() + static_cast<size_t>((e * 2 + 1) * I * H) * el,
                             out->w2.data<unsigned char>() + static_cast<size_t>(e * H * I) * el};
    for (int p = 0; p < 3; ++p) {
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t, file.read(parts[p]->name));
      if (t.nbytes()) std::memcpy(dst[p], t.data<unsigned char>(), t.nbytes());
    }
  }
  return Status::Ok();
}

// The shared expert next to the routed ones, in the experts' dtype (BF16/F32;
// refused beside F8_E4M3 experts, which have no shared path here), or nothing.
// Any other tensor under its prefix is refused by name: nothing is ignored.
Status read_shared_expert(const io::SafetensorsFile& file, const std::string& prefix, LayerCheckpoint* out) {
  const int64_t H = out->w13.shape()[2];
  const DType dtype = out->w13.dtype();
  std::vector<std::string> found;  // every tensor of a shared expert prefix
  std::string sp;
  for (const char* s : {"shared_experts.", "shared_expert."}) {
    for (const io::SafetensorsEntry& e : file.entries()) {
      if (e.name.starts_with(prefix + s)) {
        found.push_back(e.name);
        sp = prefix + s;
      }
    }
  }
  const std::string gate_name = prefix + "shared_expert_gate.weight";
  const io::SafetensorsEntry* gate = file.find(gate_name);
  if (found.empty()) {
    if (gate != nullptr) return InvalidArgument(gate_name + ": a shared expert gate, but no shared expert tensors");
    return Status::Ok();
  }
  std::string list;
  for (size_t i = 0; i < found.size() && i < 6; ++i) list += (i ? ", " : "") + found[i];
  if (dtype == DType::kF8E4M3) {
    return InvalidArgument(file.path() + ": shared expert tensors (" + list + ") beside F8_E4M3 experts; moekit "
                           "runs a shared expert with BF16/F32 weights only, and would otherwise ignore them");
  }
  const io::SafetensorsEntry* g = file.find(sp + "gate_proj.weight");
  const io::SafetensorsEntry* u = file.find(sp + "up_proj.weight");
  const io::SafetensorsEntry* d = file.find(sp + "down_proj.weight");
  for (const std::string& n : found) {
    if (n != sp + "gate_proj.weight" && n != sp + "up_proj.weight" && n != sp + "down_proj.weight") {
      return InvalidArgument(n + ": not a shared expert tensor moekit reads (" + sp +
                             "{gate,up,down}_proj.weight); refused rather than ignored");
    }
  }
  if (g == nullptr || u == nullptr || d == nullptr) {
    return InvalidArgument(sp + "{gate,up,down}_proj.weight: the shared expert is incomplete (found " + list + ")");
  }
  if (g->shape.size() != 2 || g->shape[1] != H || g->shape[0] < 1) {
    return InvalidArgument(g->name + ": expected [Is, " + std::to_string(H) + "], got " + shape_text(g->shape));
  }
  const int64_t Is = g->shape[0];
  const std::pair<const io::SafetensorsEntry*, std::vector<int64_t>> want[3] = {{g, {Is, H}}, {u, {Is, H}}, {d, {H, Is}}};
  for (const auto& [e, shape] : want) {
    if (e->dtype != dtype) {
      return InvalidArgument(e->name + ": dtype " + e->dtype_name + " differs from the experts' " + dtype_name(dtype));
    }
    if (e->shape != shape) return InvalidArgument(e->name + ": expected " + shape_text(shape) + ", got " + shape_text(e->shape));
    MOEKIT_RETURN_IF_ERROR(check_no_scale(file, *e));
  }
  out->shared_w13 = HostTensor(dtype, {2 * Is, H});
  MOEKIT_ASSIGN_OR_RETURN(HostTensor gt, file.read(g->name));
  MOEKIT_ASSIGN_OR_RETURN(HostTensor ut, file.read(u->name));
  std::memcpy(out->shared_w13.data<unsigned char>(), gt.data<unsigned char>(), gt.nbytes());
  std::memcpy(out->shared_w13.data<unsigned char>() + gt.nbytes(), ut.data<unsigned char>(), ut.nbytes());
  MOEKIT_ASSIGN_OR_RETURN(out->shared_w2, file.read(d->name));
  if (gate != nullptr) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor gw, optional_f32(file, {gate_name}, {1, H}));
    out->shared_gate = HostTensor(DType::kF32, {H});
    std::memcpy(out->shared_gate.data<float>(), gw.data<float>(), sizeof(float) * H);
  }
  out->shared_prefix = sp;
  return Status::Ok();
}

}  // namespace

StatusOr<LayerCheckpoint> load_layer_checkpoint(const io::SafetensorsFile& file, std::optional<int> layer,
                                                 const LayerSizeCheck& check_size) {
  std::map<std::string, Candidate> found;  // by prefix
  for (const io::SafetensorsEntry& e : file.entries()) {
    if (const std::optional<std::string> stacked = stacked_w13_prefix(e.name)) {
      if (file.contains(*stacked + "w2")) found[*stacked].naming = "moekit";
      continue;
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::optional<ExpertTensorName> name, parse_expert_tensor_name(e.name));
    if (!name) continue;
    Candidate& c = found[name->prefix];
    const std::string naming = name->mixtral ? "w1/w3/w2" : "gate_proj/up_proj/down_proj";
    if (!c.naming.empty() && c.naming != naming) {
      return InvalidArgument(file.path() + ": " + name->prefix + "experts.* mixes the " + c.naming + " and " +
                             naming + " namings");
    }
    c.naming = naming;
    ExpertTensors& x = c.experts[name->expert];
    switch (name->projection) {
      case Projection::kGate: x.gate = &e; break;
      case Projection::kUp: x.up = &e; break;
      case Projection::kDown: x.down = &e; break;
    }
  }
  std::vector<std::string> prefixes;
  for (const auto& [prefix, c] : found) {
    if (!layer || in_layer(prefix, *layer)) prefixes.push_back(prefix);
  }
  if (prefixes.empty()) {
    // Name what is there: the tensors under the layer's prefix (or the file's), not a missing prefix.
    std::vector<std::string> there;
    for (const io::SafetensorsEntry& e : file.entries()) {
      if (!layer || in_layer(e.name, *layer)) there.push_back(e.name);
    }
    std::string where = layer ? " for layer " + std::to_string(*layer) : std::string();
    if (layer && there.empty()) where += " (no tensor under 'layers." + std::to_string(*layer) + ".')";
    std::string found;
    for (size_t i = 0; i < there.size() && i < 12; ++i) found += (i ? ", " : "") + there[i];
    if (there.size() > 12) found += ", ... (" + std::to_string(there.size()) + " in all)";
    return NotFound(file.path() + ": no MoE layer weights" + where +
                    "; expected w13/w2, experts.<e>.{gate_proj,up_proj,down_proj}.weight or experts.<e>.{w1,w2,w3}.weight" +
                    (found.empty() ? std::string()
                                   : "; found " + std::to_string(there.size()) + " tensors: " + found +
                                         " (fused and gpt-oss namings are read from a model folder: --model)"));
  }
  if (prefixes.size() > 1) {
    std::string list;
    for (size_t i = 0; i < prefixes.size() && i < 4; ++i) list += (i ? ", " : "") + ("'" + prefixes[i] + "'");
    return InvalidArgument(file.path() + ": " + std::to_string(prefixes.size()) + " MoE layers (" + list +
                           (prefixes.size() > 4 ? ", ..." : "") + "); pick one with --layer N");
  }
  const std::string& prefix = prefixes[0];
  const Candidate& c = found.at(prefix);
  LayerCheckpoint out;
  out.naming = c.naming;
  out.prefix = prefix;
  if (c.naming == "moekit") {
    const io::SafetensorsEntry& w13 = *file.find(prefix + "w13");
    const io::SafetensorsEntry& w2 = *file.find(prefix + "w2");
    MOEKIT_RETURN_IF_ERROR(check_weight_dtype(w13));
    MOEKIT_RETURN_IF_ERROR(check_weight_dtype(w2));
    if (w13.shape.size() != 3 || w2.shape.size() != 3 || w2.shape[0] != w13.shape[0] || w2.shape[1] != w13.shape[2]) {
      return InvalidArgument(file.path() + ": w13 " + shape_text(w13.shape) + " and w2 " + shape_text(w2.shape) +
                             " must be [E, 2I, H] and [E, H, I]");
    }
    if (w13.dtype != w2.dtype) return InvalidArgument(file.path() + ": w13 and w2 must share a dtype");
    if (check_size) {
      MOEKIT_RETURN_IF_ERROR(check_size(LayerSize{w13.shape[0], w13.shape[1], w13.shape[2], w2.shape[2], *w13.dtype}));
    }
    if (w13.dtype == DType::kF8E4M3) {
      MOEKIT_ASSIGN_OR_RETURN(out.fp8, read_stacked_fp8_scales(file, prefix));
    } else if (file.contains(prefix + "w13_scale") || file.contains(prefix + "w2_scale")) {
      return InvalidArgument(file.path() + ": " + prefix + "w13_scale/w2_scale given for " + w13.dtype_name +
                             " weights (scales belong to F8_E4M3 weights)");
    }
    MOEKIT_ASSIGN_OR_RETURN(out.w13, file.read(w13.name));
    MOEKIT_ASSIGN_OR_RETURN(out.w2, file.read(w2.name));
  } else {
    MOEKIT_RETURN_IF_ERROR(stack_experts(file, prefix, c, check_size, &out));
  }
  const int64_t E = out.w13.shape()[0], H = out.w13.shape()[2];
  MOEKIT_ASSIGN_OR_RETURN(out.score_bias,
                          optional_f32(file, {prefix + "e_score_correction_bias", prefix + "gate.e_score_correction_bias"}, {E}));
  MOEKIT_ASSIGN_OR_RETURN(out.router, optional_f32(file, {prefix + "gate.weight"}, {E, H}));
  MOEKIT_RETURN_IF_ERROR(read_shared_expert(file, prefix, &out));
  return out;
}

}  // namespace moekit::tools
