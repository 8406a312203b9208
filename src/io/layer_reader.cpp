#include "io/layer_reader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <set>

#include "core/weight4.h"
#include "io/checkpoint_text.h"
#include "io/fp8_scales.h"
#include "io/mxfp4.h"
#include "moekit/parallel_for.h"

namespace moekit::io {
namespace {



constexpr const char* kScaleSuffixes[] = {".weight_scale_inv", ".weight_scale", ".input_scale"};
// compressed-tensors' packed weight, in place of <proj>.weight.
constexpr std::string_view kPacked = ".weight_packed";

// <proj>.weight_packed names its expert and projection as <proj>.weight does.
std::string as_weight_name(const std::string& n) {
  return n.ends_with(kPacked) ? n.substr(0, n.size() - std::string_view("_packed").size()) : n;
}

// The projections of one expert found under the per-expert naming.
struct ExpertTensors {
  std::array<std::string, 3> name;  // gate, up, down; empty when missing
};

class BlockReader {
 public:
  BlockReader(TensorFiles& files, const ModelMoeConfig* model, std::string prefix, CheckpointLayer* out,
              bool keep_packed)
      : files_(files), model_(model), p_(std::move(prefix)), out_(out), keep_packed_(keep_packed) {}

  Status read(const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    MOEKIT_RETURN_IF_ERROR(read_experts(check_size));
    MOEKIT_RETURN_IF_ERROR(read_router());
    MOEKIT_RETURN_IF_ERROR(read_shared());
    MOEKIT_RETURN_IF_ERROR(refuse_unused());
    auto& q = out_->config.quant;
    q.weight_dtype = dtype_;
    // fp8 and 4-bit weights compute in bf16
    q.act_dtype = dtype_ == DType::kF8E4M3 || dtype_ == DType::kU8 ? DType::kBF16 : dtype_;
    if (w4_method_ != QuantMethod::kNone) {
      q.method = w4_method_;
      out_->w13_scale = std::move(w4_scale13_);
      out_->w2_scale = std::move(w4_scale2_);
      return Status::Ok();
    }
    q.method = fp8_.method;
    q.act_scale = fp8_.act_scale;
    out_->w13_scale = std::move(fp8_.w13_scale);
    out_->w2_scale = std::move(fp8_.w2_scale);
    out_->a13_scale = std::move(fp8_.a13_scale);
    out_->a2_scale = std::move(fp8_.a2_scale);
    return Status::Ok();
  }

 private:
  // " from config.json" where a folder's config set the size, for messages.
  const char* from_config() const { return model_ != nullptr ? " from config.json" : ""; }
  bool has(const std::string& n) const { return files_.contains(n); }

  // A tensor of this name, marked as read (refuse_unused() spares it).
  StatusOr<const SafetensorsEntry*> use(const std::string& name) {
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, files_.entry(name));
    used_.insert(name);
    return e;
  }

  // A required weight of this exact shape: BF16, F32 or (expert weights) F8_E4M3.
  StatusOr<const SafetensorsEntry*> need(const std::string& name, const std::vector<int64_t>& shape,
                                         bool fp8_allowed, const std::string& why = "") {
    if (!has(name)) return NotFound(name + " is missing" + why);
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, use(name));
    const bool fp8 = fp8_allowed && e->dtype == DType::kF8E4M3;
    if (e->dtype != DType::kBF16 && e->dtype != DType::kF32 && !fp8) {
      return InvalidArgument(name + ": dtype " + e->dtype_name + " (moekit loads BF16 or F32" +
                             (fp8_allowed ? std::string(", or F8_E4M3 with its scales,") : std::string()) +
                             " weights)");
    }
    if (e->shape != shape) {
      return InvalidArgument(name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(shape) +
                             from_config());
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

  // A scale beside an unquantized weight would be silently ignored: refuse it.
  Status no_scale(const SafetensorsEntry& w) {
    const std::string base = w.name.substr(0, w.name.size() - std::string(".weight").size());
    for (const char* suffix : kScaleSuffixes) {
      if (has(base + suffix)) {
        return InvalidArgument(base + suffix + ": a scale for " + w.name + ", which is " + w.dtype_name +
                               ", not F8_E4M3");
      }
    }
    return Status::Ok();
  }

  StatusOr<HostTensor> optional_f32(const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
    for (const std::string& n : names) {
      if (!has(n)) continue;
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, need(n, shape, false));
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t, files_.read(e->name));
      return convert(t.view(), DType::kF32);
    }
    return HostTensor();
  }

  // Copies tensor `name` into dst at element offset `at`.
  Status copy_into(const std::string& name, HostTensor& dst, int64_t at) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t, files_.read(name));
    std::memcpy(dst.data<unsigned char>() + at * dtype_size(dst.dtype()), t.data<unsigned char>(), t.nbytes());
    return Status::Ok();
  }

  Status size_check(const std::function<Status(const CheckpointLayerSize&)>& check_size, int64_t w13_rows) {
    if (!check_size) return Status::Ok();
    CheckpointLayerSize size;
    size.config = out_->config;
    size.dtype = dtype_;
    size.w13_rows = w13_rows;
    for (const std::string& n : files_.names_under(p_)) {
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, files_.entry(n));
      size.tensor_bytes += e->nbytes;
    }
    return check_size(size);
  }

  // E, H and I: config.json's, or (a layer file) the tensors'.
  void set_sizes(int64_t E, int64_t H, int64_t I) {
    out_->config.num_experts = E;
    out_->config.hidden = H;
    out_->config.intermediate = I;
  }

  Status read_experts(const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    const std::string experts = p_ + "experts.";
    std::map<int64_t, ExpertTensors> per_expert;
    std::string per_expert_naming;
    for (const std::string& n : files_.names_under(experts)) {
      const bool packed = n.ends_with(kPacked);
      MOEKIT_ASSIGN_OR_RETURN(const std::optional<ExpertTensorName> name, parse_expert_tensor_name(as_weight_name(n)));
      if (!name || name->prefix != p_) continue;
      const std::string naming = std::string(name->mixtral ? "experts.<e>.{w1,w3,w2}.weight"
                                                           : "experts.<e>.{gate,up,down}_proj.weight") +
                                 (packed ? "_packed (int4 pack-quantized)" : "");
      if (!per_expert_naming.empty() && per_expert_naming != naming) {
        return InvalidArgument(experts + "* mixes the " + per_expert_naming + " and " + naming + " namings");
      }
      per_expert_naming = naming;
      per_expert[name->expert].name[static_cast<int>(name->projection)] = n;
    }
    const bool fused = has(experts + "gate_up_proj") || has(experts + "down_proj") ||
                       has(experts + "gate_up_proj_blocks") || has(experts + "down_proj_blocks");
    const bool stacked = has(p_ + "w13") && has(p_ + "w2");
    if (fused + stacked + !per_expert.empty() > 1) {
      return InvalidArgument(p_ + ": experts under two namings (" +
                             std::string(fused ? "fused experts.gate_up_proj" : "stacked w13/w2") + " and " +
                             (per_expert.empty() ? "stacked w13/w2" : "per-expert experts.<e>.*") +
                             "); which is meant?");
    }
    if (fused) return read_fused(check_size);
    if (stacked) return read_stacked(check_size);
    if (!per_expert.empty()) {
      out_->naming = per_expert_naming;
      return read_per_expert(per_expert, check_size);
    }
    return InvalidArgument("no expert naming recognised under '" + experts + "'; names found there: " +
                           list_names(files_.names_under(experts)));
  }

  static std::string any_name(const ExpertTensors& x) {
    for (const std::string& n : x.name) {
      if (!n.empty()) return n;
    }
    return std::string();
  }

  Status read_per_expert(const std::map<int64_t, ExpertTensors>& found,
                         const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    const std::string experts = p_ + "experts.";
    const bool mixtral = out_->naming.find("w1") != std::string::npos;
    const bool packed = out_->naming.find("_packed") != std::string::npos;
    const char* names[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
    if (packed && model_ == nullptr) {
      return InvalidArgument(any_name(found.begin()->second) + ": compressed-tensors INT4 experts are read from a model "
                             "folder (--model DIR), whose \"quantization_config\" gives their scheme");
    }
    int64_t E = found.rbegin()->first + 1;
    if (model_ != nullptr) {
      E = model_->config.num_experts;
      if (auto past = found.lower_bound(E); past != found.end()) {
        std::string name;
        for (const std::string& n : past->second.name) name = name.empty() ? n : name;
        return InvalidArgument(name + ": an expert past the " + std::to_string(E) + " of config.json");
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      auto it = found.find(e);
      if (it == found.end()) return NotFound(experts + std::to_string(e) + ": expert missing");
      for (int p = 0; p < 3; ++p) {
        if (it->second.name[p].empty()) {
          return NotFound(experts + std::to_string(e) + "." + names[p] + (packed ? ".weight_packed" : ".weight") +
                          " is missing");
        }
      }
    }
    int64_t H = 0, I = 0;
    if (model_ != nullptr) {
      H = model_->config.hidden;
      I = model_->config.intermediate;
    } else {
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g0, files_.entry(found.at(0).name[0]));
      if (g0->shape.size() != 2) return InvalidArgument(g0->name + ": expected [I, H], got " + shape_text(g0->shape));
      I = g0->shape[0];
      H = g0->shape[1];
    }
    set_sizes(E, H, I);
    if (packed) return read_per_expert_int4(found, E, H, I, check_size);
    std::vector<std::array<const SafetensorsEntry*, 3>> parts;  // [E][3], all checked before anything is read
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int64_t> shapes[3] = {{I, H}, {I, H}, {H, I}};
      std::array<const SafetensorsEntry*, 3> x{};
      for (int p = 0; p < 3; ++p) {
        MOEKIT_ASSIGN_OR_RETURN(x[p], need(found.at(e).name[p], shapes[p], true));
        MOEKIT_RETURN_IF_ERROR(same_dtype(*x[p]));
      }
      parts.push_back(x);
    }
    if (dtype_ == DType::kF8E4M3) {
      MOEKIT_ASSIGN_OR_RETURN(fp8_, read_expert_fp8_scales(files_, parts, I, H));
      for (const auto& x : parts) {
        for (const SafetensorsEntry* w : x) {
          const std::string base = w->name.substr(0, w->name.size() - std::string(".weight").size());
          for (const char* suffix : kScaleSuffixes) used_.insert(base + suffix);
        }
      }
    } else {
      for (const auto& x : parts) {
        for (const SafetensorsEntry* w : x) MOEKIT_RETURN_IF_ERROR(no_scale(*w));
      }
    }
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, 2 * I));
    out_->w13 = HostTensor(dtype_, {E, 2 * I, H});
    out_->w2 = HostTensor(dtype_, {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[e][0]->name, out_->w13, e * 2 * I * H));        // gate rows
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[e][1]->name, out_->w13, (e * 2 + 1) * I * H));  // up rows
      MOEKIT_RETURN_IF_ERROR(copy_into(parts[e][2]->name, out_->w2, e * H * I));
    }
    return Status::Ok();
  }

  // <name>: I32 or I64 [2] holding (N, K).
  Status check_weight_shape(const std::string& name, int64_t N, int64_t K) {
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e,
                            use_named(name, " (compressed-tensors packed weights carry their unpacked shape)"));
    if ((e->dtype_name != "I32" && e->dtype_name != "I64") || e->shape != std::vector<int64_t>{2}) {
      return InvalidArgument(name + ": " + e->dtype_name + " " + shape_text(e->shape) + ", expected I32 or I64 [2]");
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, files_.copy_bytes(name));
    int64_t v[2];
    for (int i = 0; i < 2; ++i) {
      if (e->dtype_name == "I32") {
        int32_t x;
        std::memcpy(&x, bytes.data() + 4 * i, 4);
        v[i] = x;
      } else {
        std::memcpy(&v[i], bytes.data() + 8 * i, 8);
      }
    }
    if (v[0] != N || v[1] != K) {
      return InvalidArgument(name + ": (" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + "), but the weight is [" +
                             std::to_string(N) + ", " + std::to_string(K) + "]" + from_config());
    }
    return Status::Ok();
  }

  // compressed-tensors pack-quantized experts (Kimi-K2), per projection:
  // <base>.weight_packed I32 [N, K/8] (eight 4-bit values a word, the first in
  // the lowest bits, each stored as q + 8), <base>.weight_scale BF16|F16
  // [N, K/g] and <base>.weight_shape [2] = (N, K). On a little-endian host a
  // word's bytes are moekit's packing already (byte j: columns 2j low, 2j + 1
  // high); the scales widen to f32 exactly.
  Status read_per_expert_int4(const std::map<int64_t, ExpertTensors>& found, int64_t E, int64_t H, int64_t I,
                              const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    const std::string first = any_name(found.begin()->second);
    if (!model_->int4_scheme) {
      return InvalidArgument(first + ": INT4 packed experts, but no \"quantization_config\" says quant_method "
                             "\"compressed-tensors\"");
    }
    const QuantMethod method = *model_->int4_scheme;
    const int64_t g = weight4_group(method);
    if (H % g != 0 || I % g != 0) {
      return InvalidArgument(p_ + "experts: " + quant_method_name(method) + " needs H and I to be multiples of " +
                             std::to_string(g) + ", got H = " + std::to_string(H) + ", I = " + std::to_string(I) +
                             from_config());
    }
    if constexpr (std::endian::native != std::endian::little) {
      return Unsupported(first + ": INT4 packed words are read on little-endian hosts only");
    }
    struct Part {
      const SafetensorsEntry* packed;
      const SafetensorsEntry* scale;
    };
    std::vector<std::array<Part, 3>> parts(static_cast<size_t>(E));  // all checked before anything is read
    for (int64_t e = 0; e < E; ++e) {
      for (int p = 0; p < 3; ++p) {
        const std::string& n = found.at(e).name[p];
        const std::string base = n.substr(0, n.size() - kPacked.size());
        const int64_t N = p == 2 ? H : I, K = p == 2 ? I : H;
        if (has(base + ".weight_zero_point")) {
          return InvalidArgument(base + ".weight_zero_point: a zero point (asymmetric int4); moekit reads symmetric "
                                 "int4 only");
        }
        if (has(base + ".weight_g_idx")) {
          return InvalidArgument(base + ".weight_g_idx: activation reordering (actorder), which moekit does not read");
        }
        MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* pk, use(n));
        if (pk->dtype != DType::kI32) {
          return InvalidArgument(n + ": dtype " + pk->dtype_name + ", expected I32 (eight 4-bit values a word)");
        }
        if (pk->shape != std::vector<int64_t>{N, K / 8}) {
          return InvalidArgument(n + ": shape " + shape_text(pk->shape) + ", expected " + shape_text({N, K / 8}) +
                                 " (eight values a word)" + from_config());
        }
        MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* sc,
                                use_named(base + ".weight_scale", " (packed weights need their group scales)"));
        if (sc->dtype != DType::kBF16 && sc->dtype != DType::kF16) {
          return InvalidArgument(sc->name + ": dtype " + sc->dtype_name +
                                 ", expected BF16 or F16 (compressed-tensors' group scales)");
        }
        if (sc->shape != std::vector<int64_t>{N, K / g}) {
          return InvalidArgument(sc->name + ": shape " + shape_text(sc->shape) + ", expected " +
                                 shape_text({N, K / g}) + " (" + quant_method_name(method) + ": a scale per " +
                                 std::to_string(g) + " columns)" + from_config());
        }
        MOEKIT_RETURN_IF_ERROR(check_weight_shape(base + ".weight_shape", N, K));
        parts[e][p] = {pk, sc};
      }
    }
    dtype_ = DType::kU8;
    dtype_set_ = true;
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, 2 * I));
    out_->w13 = HostTensor(DType::kU8, {E, 2 * I, H / 2});
    out_->w2 = HostTensor(DType::kU8, {E, H, I / 2});
    HostTensor s13(DType::kF32, {E, 2 * I, H / g}), s2(DType::kF32, {E, H, I / g});
    for (int64_t e = 0; e < E; ++e) {
      for (int p = 0; p < 3; ++p) {
        // gate rows, then up rows; down rows
        const int64_t row0 = p == 2 ? e * H : (2 * e + p) * I, K = p == 2 ? I : H;
        HostTensor& w = p == 2 ? out_->w2 : out_->w13;
        HostTensor& sd = p == 2 ? s2 : s13;
        MOEKIT_RETURN_IF_ERROR(copy_into(parts[e][p].packed->name, w, row0 * K / 2));
        MOEKIT_ASSIGN_OR_RETURN(const HostTensor raw, files_.read(parts[e][p].scale->name));
        MOEKIT_ASSIGN_OR_RETURN(const HostTensor f, convert(raw.view(), DType::kF32));
        MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(method, f.view(), parts[e][p].scale->name));
        const int64_t N = p == 2 ? H : I;
        const TensorView packed = TensorView::contiguous(w.data<uint8_t>() + row0 * K / 2, DType::kU8, {N, K / 2},
                                                         Device::cpu());
        MOEKIT_RETURN_IF_ERROR(
            check_weight4_range(method, packed, f.view(), parts[e][p].packed->name, parts[e][p].scale->name));
        std::memcpy(sd.data<float>() + row0 * (K / g), f.data<float>(), f.nbytes());
      }
    }
    w4_method_ = method;
    w4_scale13_ = std::move(s13);
    w4_scale2_ = std::move(s2);
    return Status::Ok();
  }

  // The stacked naming in a 4-bit scheme (what `moekit quantize` writes):
  // w13 U8 [E, N, H/2], w2 U8 [E, H, I/2], two values a byte, with w13_scale
  // [E, N, H/g] and w2_scale [E, H, I/g]: U8 E8M0 exponents (mxfp4, g = 32) or
  // F32 (int4, g = 32 or 128, told by the scales' width).
  Status read_stacked_weight4(const SafetensorsEntry* w13, const SafetensorsEntry* w2,
                              const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    if (w13->dtype != w2->dtype) return InvalidArgument(files_.where() + ": " + p_ + "w13 and w2 must share a dtype");
    if (w13->shape.size() != 3 || w2->shape.size() != 3 || w2->shape[0] != w13->shape[0] ||
        w2->shape[1] != 2 * w13->shape[2] || w13->shape[2] < 1 || w2->shape[2] < 1) {
      return InvalidArgument(files_.where() + ": " + p_ + "w13 " + shape_text(w13->shape) + " and w2 " +
                             shape_text(w2->shape) + " must be [E, N, H/2] and [E, H, I/2] (U8: two 4-bit values a byte)");
    }
    const int64_t E = w13->shape[0], N = w13->shape[1], H = w2->shape[1], I = 2 * w2->shape[2];
    if (model_ != nullptr) {
      const MoeConfig& c = model_->config;
      const int64_t n1 = c.activation.gated() ? 2 * c.intermediate : c.intermediate;
      if (E != c.num_experts || N != n1 || H != c.hidden || I != c.intermediate) {
        return InvalidArgument(p_ + "w13 " + shape_text(w13->shape) + " / w2 " + shape_text(w2->shape) +
                               ": expected " + shape_text({c.num_experts, n1, c.hidden / 2}) + " / " +
                               shape_text({c.num_experts, c.hidden, c.intermediate / 2}) + " from config.json");
      }
    }
    const std::string why = " (4-bit U8 weights need their scales)";
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* s13, use_named(p_ + "w13_scale", why));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* s2, use_named(p_ + "w2_scale", why));
    if (s13->dtype != s2->dtype || (s13->dtype != DType::kU8 && s13->dtype != DType::kF32)) {
      return InvalidArgument(s13->name + " / " + s2->name + ": dtypes " + s13->dtype_name + " / " + s2->dtype_name +
                             ", expected both U8 (mxfp4's E8M0 exponents) or both F32 (int4)");
    }
    if (s13->shape.size() != 3 || s13->shape[2] < 1 || H % s13->shape[2] != 0) {
      return InvalidArgument(s13->name + ": shape " + shape_text(s13->shape) + ", expected [E, N, H/group] with H = " +
                             std::to_string(H));
    }
    const int64_t g = H / s13->shape[2];
    QuantMethod method = QuantMethod::kNone;
    if (s13->dtype == DType::kU8 && g == 32) method = QuantMethod::kMxfp4;
    if (s13->dtype == DType::kF32 && g == 32) method = QuantMethod::kInt4G32;
    if (s13->dtype == DType::kF32 && g == 128) method = QuantMethod::kInt4G128;
    if (method == QuantMethod::kNone) {
      return InvalidArgument(s13->name + ": " + s13->dtype_name + " " + shape_text(s13->shape) + " makes groups of " +
                             std::to_string(g) + " columns; mxfp4 (U8) has groups of 32, int4 (F32) of 32 or 128");
    }
    if (I % g != 0) {
      return InvalidArgument(p_ + "w2: I = " + std::to_string(I) + " is not a multiple of " +
                             quant_method_name(method) + "'s group of " + std::to_string(g));
    }
    for (const auto& [e, want] : {std::pair{s13, std::vector<int64_t>{E, N, H / g}},
                                  std::pair{s2, std::vector<int64_t>{E, H, I / g}}}) {
      if (e->shape != want) {
        return InvalidArgument(e->name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(want) + " (" +
                               quant_method_name(method) + ")");
      }
    }
    set_sizes(E, H, I);
    dtype_ = DType::kU8;
    dtype_set_ = true;
    out_->naming = std::string("w13/w2 (stacked, ") + quant_method_name(method) + ")";
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, N));
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t13, files_.read(s13->name));
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t2, files_.read(s2->name));
    MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(method, t13.view(), s13->name));
    MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(method, t2.view(), s2->name));
    MOEKIT_ASSIGN_OR_RETURN(out_->w13, files_.read_in_place(w13->name));
    MOEKIT_ASSIGN_OR_RETURN(out_->w2, files_.read_in_place(w2->name));
    MOEKIT_RETURN_IF_ERROR(check_weight4_range(method, out_->w13.view(), t13.view(), w13->name, s13->name));
    MOEKIT_RETURN_IF_ERROR(check_weight4_range(method, out_->w2.view(), t2.view(), w2->name, s2->name));
    w4_method_ = method;
    w4_scale13_ = std::move(t13);
    w4_scale2_ = std::move(t2);
    return Status::Ok();
  }

  // moekit's own naming: <prefix>w13 [E, N, H], <prefix>w2 [E, H, I], with
  // <prefix>w13_scale/w2_scale (and a13_scale/a2_scale) for F8_E4M3.
  Status read_stacked(const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* w13, use(p_ + "w13"));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* w2, use(p_ + "w2"));
    if (w13->dtype == DType::kU8 || w2->dtype == DType::kU8) return read_stacked_weight4(w13, w2, check_size);
    for (const SafetensorsEntry* w : {w13, w2}) {
      if (w->dtype != DType::kBF16 && w->dtype != DType::kF32 && w->dtype != DType::kF8E4M3) {
        return InvalidArgument(w->name + ": weights must be BF16, F32, F8_E4M3 or U8 (4-bit, with scales), got " +
                               w->dtype_name);
      }
    }
    if (w13->shape.size() != 3 || w2->shape.size() != 3 || w2->shape[0] != w13->shape[0] ||
        w2->shape[1] != w13->shape[2]) {
      return InvalidArgument(files_.where() + ": " + p_ + "w13 " + shape_text(w13->shape) + " and w2 " +
                             shape_text(w2->shape) + " must be [E, 2I, H] and [E, H, I]");
    }
    if (w13->dtype != w2->dtype) return InvalidArgument(files_.where() + ": " + p_ + "w13 and w2 must share a dtype");
    const int64_t E = w13->shape[0], N = w13->shape[1], H = w13->shape[2], I = w2->shape[2];
    if (model_ != nullptr) {
      const MoeConfig& c = model_->config;
      const int64_t n1 = c.activation.gated() ? 2 * c.intermediate : c.intermediate;
      if (E != c.num_experts || N != n1 || H != c.hidden || I != c.intermediate) {
        return InvalidArgument(p_ + "w13 " + shape_text(w13->shape) + " / w2 " + shape_text(w2->shape) +
                               ": expected " + shape_text({c.num_experts, n1, c.hidden}) + " / " +
                               shape_text({c.num_experts, c.hidden, c.intermediate}) + " from config.json");
      }
    }
    set_sizes(E, H, I);
    MOEKIT_RETURN_IF_ERROR(same_dtype(*w13));
    out_->naming = "w13/w2 (stacked)";
    if (dtype_ == DType::kF8E4M3) {
      MOEKIT_ASSIGN_OR_RETURN(fp8_, read_stacked_fp8_scales(files_, p_));
      for (const char* s : {"w13_scale", "w2_scale", "a13_scale", "a2_scale"}) used_.insert(p_ + s);
    } else if (has(p_ + "w13_scale") || has(p_ + "w2_scale")) {
      return InvalidArgument(files_.where() + ": " + p_ + "w13_scale/w2_scale given for " + w13->dtype_name +
                             " weights (scales belong to F8_E4M3 weights)");
    }
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, N));
    MOEKIT_ASSIGN_OR_RETURN(out_->w13, files_.read_in_place(w13->name));
    MOEKIT_ASSIGN_OR_RETURN(out_->w2, files_.read_in_place(w2->name));
    return Status::Ok();
  }

  // Which of [E, a, b] / [E, b, a] a fused tensor is; the family's own layout
  // decides when a == b.
  StatusOr<bool> fused_transposed(const std::string& name, int64_t E, int64_t a, int64_t b) {
    if (!has(name)) return NotFound(name + " is missing (the fused naming needs both gate_up_proj and down_proj)");
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, files_.entry(name));
    const std::vector<int64_t> plain = {E, a, b}, transposed = {E, b, a};
    if (e->shape == plain && (a != b || !model_->fused_transposed)) return false;
    if (e->shape == transposed) return true;
    return InvalidArgument(name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(plain) + " or " +
                           shape_text(transposed) + " from config.json");
  }

  // t [E, r, c] -> [E, c, r], in square tiles (each tile's rows and columns stay
  // in cache) spread over the thread pool: a checkpoint's expert tensors are GBs.
  static HostTensor transpose_last(const HostTensor& t) {
    const int64_t E = t.shape()[0], r = t.shape()[1], c = t.shape()[2];
    HostTensor out(t.dtype(), {E, c, r});
    switch (dtype_size(t.dtype())) {
      case 1: transpose_tiles(t.data<uint8_t>(), out.data<uint8_t>(), E, r, c); break;
      case 2: transpose_tiles(t.data<uint16_t>(), out.data<uint16_t>(), E, r, c); break;
      default: transpose_tiles(t.data<uint32_t>(), out.data<uint32_t>(), E, r, c); break;
    }
    return out;
  }
  template <typename T>
  static void transpose_tiles(const T* src, T* dst, int64_t E, int64_t r, int64_t c) {
    constexpr int64_t kTile = 64;
    const int64_t row_tiles = (r + kTile - 1) / kTile;
    parallel_for(E * row_tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t e = item / row_tiles, i0 = item % row_tiles * kTile, i1 = std::min(r, i0 + kTile);
        const T* s = src + e * r * c;
        T* d = dst + e * r * c;
        for (int64_t j0 = 0; j0 < c; j0 += kTile) {
          const int64_t j1 = std::min(c, j0 + kTile);
          for (int64_t j = j0; j < j1; ++j) {
            for (int64_t i = i0; i < i1; ++i) d[j * r + i] = s[i * c + j];
          }
        }
      }
    });
  }

  // experts.gate_up_proj / experts.down_proj (+ _bias): transformers v5's
  // fused layout. Its orientation and row order are the family's, so it is
  // read from a model folder only.
  Status read_fused(const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    const std::string gu = p_ + "experts.gate_up_proj", dn = p_ + "experts.down_proj";
    if (model_ == nullptr) {
      return InvalidArgument(files_.where() + ": " + gu + ": the fused naming is read from a model folder "
                             "(--model DIR): its orientation and gate/up row order are the family's, in config.json");
    }
    const MoeConfig& c = model_->config;
    const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate;
    if (has(gu + "_blocks") || has(dn + "_blocks")) return read_mxfp4(check_size);
    MOEKIT_ASSIGN_OR_RETURN(const bool gu_t, fused_transposed(gu, E, 2 * I, H));
    MOEKIT_ASSIGN_OR_RETURN(const bool dn_t, fused_transposed(dn, E, H, I));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g, need(gu, gu_t ? std::vector<int64_t>{E, H, 2 * I}
                                                                      : std::vector<int64_t>{E, 2 * I, H}, true));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* d,
                            need(dn, dn_t ? std::vector<int64_t>{E, I, H} : std::vector<int64_t>{E, H, I}, true));
    MOEKIT_RETURN_IF_ERROR(same_dtype(*g));
    MOEKIT_RETURN_IF_ERROR(same_dtype(*d));
    if (dtype_ == DType::kF8E4M3) {
      return Unsupported(gu + ": F8_E4M3 fused experts are not read yet (per-expert fp8 names are)");
    }
    const bool interleaved = model_->gate_up_order == GateUpOrder::kInterleaved;
    out_->naming = std::string("experts.{gate_up_proj") + (gu_t ? " [E, H, 2I]" : " [E, 2I, H]") +
                   (interleaved ? " interleaved" : "") + ", down_proj" + (dn_t ? " [E, I, H]" : " [E, H, I]") + "}";
    MOEKIT_RETURN_IF_ERROR(check_fused_biases());
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, 2 * I));
    // In moekit's orientation a borrowed image's tensors are used in place.
    MOEKIT_ASSIGN_OR_RETURN(HostTensor w13, files_.read_in_place(gu));  // transposed: read once, into the transpose
    MOEKIT_ASSIGN_OR_RETURN(HostTensor w2, files_.read_in_place(dn));
    // Rows keep their order: chunked rows are moekit's gated layout, interleaved
    // rows are swiglu_oai's (kernel.h), which is the only activation such families use.
    out_->w13 = gu_t ? transpose_last(w13) : std::move(w13);
    out_->w2 = dn_t ? transpose_last(w2) : std::move(w2);
    return read_fused_biases();
  }

  // experts.gate_up_proj_bias [E, 2I] and down_proj_bias [E, H] (gpt-oss), f32.
  bool fused_biases() const {
    return model_->config.has_expert_bias || has(p_ + "experts.gate_up_proj_bias") ||
           has(p_ + "experts.down_proj_bias");
  }
  Status check_fused_biases() {
    if (!fused_biases()) return Status::Ok();
    const MoeConfig& c = model_->config;
    const std::string why = " (the experts' biases, which " + model_->model_type + " has)";
    MOEKIT_RETURN_IF_ERROR(need(p_ + "experts.gate_up_proj_bias", {c.num_experts, 2 * c.intermediate}, false, why).status());
    return need(p_ + "experts.down_proj_bias", {c.num_experts, c.hidden}, false, why).status();
  }
  Status read_fused_biases() {
    if (!fused_biases()) return Status::Ok();
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t1, files_.read(p_ + "experts.gate_up_proj_bias"));
    MOEKIT_ASSIGN_OR_RETURN(HostTensor t2, files_.read(p_ + "experts.down_proj_bias"));
    MOEKIT_ASSIGN_OR_RETURN(out_->w13_bias, convert(t1.view(), DType::kF32));
    MOEKIT_ASSIGN_OR_RETURN(out_->w2_bias, convert(t2.view(), DType::kF32));
    out_->config.has_expert_bias = true;
    return Status::Ok();
  }

  // gpt-oss's MXFP4 experts: experts.{gate_up,down}_proj_{blocks,scales}
  // ([E, 2I, H/32, 16] / [E, 2I, H/32] and [E, H, I/32, 16] / [E, H, I/32]),
  // in moekit's orientation already (rows = outputs, interleaved gate/up),
  // dequantized exactly to bf16 (io/mxfp4.h): the layer then runs as bf16.
  // keep_packed_: the blocks are moekit's mxfp4 packing already (a row's 32
  // values of a group in 16 bytes, low nibble first), read as [E, rows, K/2].
  Status read_mxfp4(const std::function<Status(const CheckpointLayerSize&)>& check_size) {
    const MoeConfig& c = model_->config;
    const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate;
    if (!model_->mxfp4_experts) {
      return InvalidArgument(p_ + "experts.*_blocks: MXFP4 experts, but no \"quantization_config\" says "
                             "quant_method \"mxfp4\"");
    }
    if (H % kMxfp4Block != 0 || I % kMxfp4Block != 0) {
      return InvalidArgument(p_ + "experts: MXFP4 needs H and I to be multiples of 32, got H = " + std::to_string(H) +
                             ", I = " + std::to_string(I));
    }
    struct Part {
      std::string name;
      int64_t rows, k;
    };
    const Part parts[2] = {{p_ + "experts.gate_up_proj", 2 * I, H}, {p_ + "experts.down_proj", H, I}};
    for (const Part& part : parts) {
      const std::string why = " (MXFP4 experts come in _blocks and _scales pairs)";
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* blocks, use_named(part.name + "_blocks", why));
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* scales, use_named(part.name + "_scales", why));
      const std::vector<int64_t> want_b = {E, part.rows, part.k / kMxfp4Block, kMxfp4Block / 2};
      const std::vector<int64_t> want_s = {E, part.rows, part.k / kMxfp4Block};
      for (const auto& [e, want] : {std::pair{blocks, want_b}, std::pair{scales, want_s}}) {
        if (e->dtype != DType::kU8) return InvalidArgument(e->name + ": dtype " + e->dtype_name + ", expected U8");
        if (e->shape != want) {
          return InvalidArgument(e->name + ": shape " + shape_text(e->shape) + ", expected " + shape_text(want) +
                                 " from config.json");
        }
      }
    }
    MOEKIT_RETURN_IF_ERROR(check_fused_biases());
    if (keep_packed_) {
      dtype_ = DType::kU8;
      dtype_set_ = true;
      out_->naming = "experts.{gate_up_proj,down_proj}_{blocks,scales} (MXFP4, interleaved; kept packed)";
      MOEKIT_RETURN_IF_ERROR(size_check(check_size, 2 * I));
      out_->w13 = HostTensor(DType::kU8, {E, 2 * I, H / 2});
      out_->w2 = HostTensor(DType::kU8, {E, H, I / 2});
      HostTensor* dst[2] = {&out_->w13, &out_->w2};
      HostTensor* scales[2] = {&w4_scale13_, &w4_scale2_};
      for (int i = 0; i < 2; ++i) {
        MOEKIT_RETURN_IF_ERROR(copy_into(parts[i].name + "_blocks", *dst[i], 0));
        MOEKIT_ASSIGN_OR_RETURN(*scales[i], files_.read(parts[i].name + "_scales"));
        MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(QuantMethod::kMxfp4, scales[i]->view(),
                                                          parts[i].name + "_scales"));
        MOEKIT_RETURN_IF_ERROR(check_weight4_range(QuantMethod::kMxfp4, dst[i]->view(), scales[i]->view(),
                                                   parts[i].name + "_blocks", parts[i].name + "_scales"));
      }
      w4_method_ = QuantMethod::kMxfp4;
      return read_fused_biases();
    }
    dtype_ = DType::kBF16;
    dtype_set_ = true;
    out_->naming = "experts.{gate_up_proj,down_proj}_{blocks,scales} (MXFP4, interleaved; dequantized to bf16)";
    MOEKIT_RETURN_IF_ERROR(size_check(check_size, 2 * I));
    HostTensor* dst[2] = {&out_->w13, &out_->w2};
    for (int i = 0; i < 2; ++i) {
      MOEKIT_ASSIGN_OR_RETURN(HostTensor blocks, files_.read(parts[i].name + "_blocks"));
      MOEKIT_ASSIGN_OR_RETURN(HostTensor scales, files_.read(parts[i].name + "_scales"));
      MOEKIT_ASSIGN_OR_RETURN(*dst[i], dequantize_mxfp4(blocks, scales, parts[i].name));
    }
    return read_fused_biases();
  }

  StatusOr<const SafetensorsEntry*> use_named(const std::string& name, const std::string& why) {
    if (!has(name)) return NotFound(name + " is missing" + why);
    return use(name);
  }

  Status read_router() {
    const int64_t E = out_->config.num_experts, H = out_->config.hidden;
    MOEKIT_ASSIGN_OR_RETURN(out_->router_weight, optional_f32({p_ + "gate.weight", p_ + "router.weight"}, {E, H}));
    MOEKIT_ASSIGN_OR_RETURN(out_->router_bias, optional_f32({p_ + "router.bias", p_ + "gate.bias"}, {E}));
    MOEKIT_ASSIGN_OR_RETURN(out_->score_bias,
                            optional_f32({p_ + "gate.e_score_correction_bias", p_ + "e_score_correction_bias"}, {E}));
    if (!out_->score_bias.shape().empty() && model_ != nullptr) {
      if (model_->config.routing.method != RoutingMethod::kDeepseekV3) {
        return InvalidArgument(p_ + "...e_score_correction_bias: a selection bias, but " + model_->model_type +
                               " routing has none");
      }
      out_->config.routing.has_score_bias = true;
    }
    return Status::Ok();
  }

  // DeepSeek's <prefix>shared_experts.* or Qwen2-MoE's <prefix>shared_expert.*
  // with <prefix>shared_expert_gate.weight. A folder's config.json says whether
  // there is one and its width; a layer file's tensors do.
  Status read_shared() {
    MoeConfig& c = out_->config;
    const int64_t H = c.hidden;
    std::string sp;  // shared expert prefix
    for (const char* s : {"shared_experts.", "shared_expert."}) {
      if (!files_.names_under(p_ + s).empty()) {
        if (!sp.empty()) return InvalidArgument(p_ + ": both shared_experts.* and shared_expert.*; which is meant?");
        sp = p_ + s;
      }
    }
    const std::string gate_name = p_ + "shared_expert_gate.weight";
    int64_t Is = model_ != nullptr ? c.shared_intermediate : 0;
    if (model_ != nullptr && Is == 0 && !sp.empty()) {
      return InvalidArgument(sp + "*: shared expert tensors, but config.json sets no shared expert "
                                  "(n_shared_experts / shared_expert_intermediate_size)");
    }
    if (model_ != nullptr && Is > 0 && sp.empty()) {
      return NotFound(p_ + "shared_experts.{gate,up,down}_proj.weight (or shared_expert.*) missing: config.json "
                           "sets a shared expert of width " + std::to_string(Is));
    }
    if (sp.empty()) {
      if (has(gate_name)) return InvalidArgument(gate_name + ": a shared expert gate, but no shared expert tensors");
      return Status::Ok();
    }
    const std::vector<std::string> found = files_.names_under(sp);
    if (dtype_ == DType::kU8) {
      return InvalidArgument(files_.where() + ": shared expert tensors (" + list_names(found, 6) + ") beside " +
                             quant_method_name(w4_method_) + " experts; moekit does not run a shared expert with "
                             "4-bit experts yet, and would otherwise ignore it");
    }
    if (dtype_ == DType::kF8E4M3) {
      return InvalidArgument(files_.where() + ": shared expert tensors (" + list_names(found, 6) +
                             ") beside F8_E4M3 experts; moekit runs a shared expert with BF16/F32 weights only, "
                             "and would otherwise ignore them");
    }
    for (const std::string& n : found) {
      if (n != sp + "gate_proj.weight" && n != sp + "up_proj.weight" && n != sp + "down_proj.weight") {
        return InvalidArgument(n + ": not a shared expert tensor moekit reads (" + sp +
                               "{gate,up,down}_proj.weight); refused rather than ignored");
      }
    }
    if (!has(sp + "gate_proj.weight") || !has(sp + "up_proj.weight") || !has(sp + "down_proj.weight")) {
      return NotFound(sp + "{gate,up,down}_proj.weight: the shared expert is incomplete (found " +
                      list_names(found, 6) + ")");
    }
    if (model_ == nullptr) {  // the width from the tensor
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g, files_.entry(sp + "gate_proj.weight"));
      if (g->shape.size() != 2 || g->shape[1] != H || g->shape[0] < 1) {
        return InvalidArgument(g->name + ": expected [Is, " + std::to_string(H) + "], got " + shape_text(g->shape));
      }
      Is = g->shape[0];
    }
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* g, need(sp + "gate_proj.weight", {Is, H}, false));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* u, need(sp + "up_proj.weight", {Is, H}, false));
    MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* d, need(sp + "down_proj.weight", {H, Is}, false));
    for (const SafetensorsEntry* e : {g, u, d}) {
      MOEKIT_RETURN_IF_ERROR(same_dtype(*e));
      MOEKIT_RETURN_IF_ERROR(no_scale(*e));
    }
    out_->shared_w13 = HostTensor(dtype_, {2 * Is, H});
    MOEKIT_RETURN_IF_ERROR(copy_into(g->name, out_->shared_w13, 0));
    MOEKIT_RETURN_IF_ERROR(copy_into(u->name, out_->shared_w13, Is * H));
    MOEKIT_ASSIGN_OR_RETURN(out_->shared_w2, files_.read(d->name));
    const bool gated = model_ != nullptr ? c.has_shared_gate : has(gate_name);
    if (gated) {
      MOEKIT_ASSIGN_OR_RETURN(HostTensor gate, optional_f32({gate_name}, {1, H}));
      if (gate.shape().empty()) return NotFound(gate_name + " [1, " + std::to_string(H) + "] missing");
      out_->shared_gate = HostTensor(DType::kF32, {H});
      std::memcpy(out_->shared_gate.data<float>(), gate.data<float>(), sizeof(float) * H);
    }
    c.shared_intermediate = Is;
    c.has_shared_gate = gated;
    out_->shared_prefix = sp;
    return Status::Ok();
  }

  // Nothing under the block's prefix is skipped without a word.
  Status refuse_unused() {
    std::vector<std::string> unused;
    for (const std::string& n : files_.names_under(p_)) {
      if (used_.count(n) == 0) unused.push_back(n);
    }
    if (unused.empty()) return Status::Ok();
    return InvalidArgument(files_.where() + ": " + std::to_string(unused.size()) + " tensor" +
                           (unused.size() > 1 ? "s" : "") + " of the MoE block '" + p_ +
                           "' that the layer does not use (" + list_names(unused, 8) +
                           "); refused rather than ignored (docs/layer_files.md lists the names read)");
  }

  TensorFiles& files_;
  const ModelMoeConfig* model_;
  std::string p_;
  CheckpointLayer* out_;
  bool keep_packed_ = false;
  DType dtype_ = DType::kBF16;
  bool dtype_set_ = false;
  Fp8Scales fp8_;
  // 4-bit experts: the method and scales (core/weight4.h layouts); kNone otherwise.
  QuantMethod w4_method_ = QuantMethod::kNone;
  HostTensor w4_scale13_, w4_scale2_;
  std::set<std::string> used_;
};

}  // namespace

Status read_moe_block(TensorFiles& files, const ModelMoeConfig* model, const std::string& prefix,
                      const std::function<Status(const CheckpointLayerSize&)>& check_size, CheckpointLayer* out,
                      bool keep_packed) {
  out->prefix = prefix;
  return BlockReader(files, model, prefix, out, keep_packed).read(check_size);
}

StatusOr<std::vector<std::string>> moe_block_prefixes(const TensorFiles& files) {
  std::set<std::string> found;
  for (const auto& [name, shard] : files.names()) {
    if (const std::optional<std::string> stacked = stacked_w13_prefix(name)) {
      if (files.contains(*stacked + "w2")) found.insert(*stacked);
      continue;
    }
    if (name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj")) {
      const std::string p = name.substr(0, name.rfind("experts."));
      if (p.empty() || p.back() == '.') found.insert(p);
      continue;
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::optional<ExpertTensorName> expert, parse_expert_tensor_name(as_weight_name(name)));
    if (expert) found.insert(expert->prefix);
  }
  return std::vector<std::string>(found.begin(), found.end());
}

}  // namespace moekit::io
