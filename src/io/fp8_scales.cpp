#include "io/fp8_scales.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "io/checkpoint_text.h"

namespace moekit::io {
namespace {

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }


// "<...>.weight" -> "<...>"
std::string base_of(const SafetensorsEntry& weight) {
  return weight.name.substr(0, weight.name.size() - std::string(".weight").size());
}

// Reads a scale tensor: F32, the given shape (or, for a scalar, [] or [1]),
// every value finite and > 0.
StatusOr<HostTensor> read_scale(TensorFiles& files, const SafetensorsEntry& e,
                                const std::vector<int64_t>& shape) {
  if (e.dtype != DType::kF32) return InvalidArgument(e.name + ": scales must be F32, got " + e.dtype_name);
  const bool scalar = shape == std::vector<int64_t>{1};
  if (e.shape != shape && !(scalar && e.shape.empty())) {
    return InvalidArgument(e.name + ": expected shape " + (scalar ? std::string("[] or [1]") : shape_text(shape)) +
                           ", got " + shape_text(e.shape));
  }
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, files.read(e.name));
  const int64_t n = e.shape.empty() ? 1 : t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = t.data<float>()[i];
    if (!std::isfinite(v) || !(v > 0.0f)) {
      return InvalidArgument(e.name + ": element " + std::to_string(i) + " is " + std::to_string(v) +
                             "; scales must be finite and > 0");
    }
  }
  return t;
}

}  // namespace

StatusOr<Fp8Scales> read_expert_fp8_scales(TensorFiles& files,
                                            const std::vector<std::array<const SafetensorsEntry*, 3>>& experts,
                                            int64_t I, int64_t H) {
  Fp8Scales out;
  const int64_t E = static_cast<int64_t>(experts.size());
  // The scheme: from expert 0's gate projection; every other projection must agree.
  const std::string base0 = base_of(*experts[0][0]);
  const bool block = files.contains(base0 + ".weight_scale_inv");
  if (!block && !files.contains(base0 + ".weight_scale")) {
    return InvalidArgument(experts[0][0]->name + " is F8_E4M3 but " + base0 + ".weight_scale_inv (block-128) and " +
                           base0 + ".weight_scale (per tensor) are both missing");
  }
  const bool static_act = files.contains(base0 + ".input_scale");
  if (static_act && block) {
    return InvalidArgument(base0 + ".input_scale: static activation scales go with per-tensor weight scales, but " +
                           base0 + ".weight_scale_inv is block-128");
  }
  out.method = block ? QuantMethod::kFp8Block128 : QuantMethod::kFp8PerTensor;
  out.act_scale = static_act ? ActScale::kStatic : ActScale::kDynamic;
  const char* own = block ? ".weight_scale_inv" : ".weight_scale";
  const char* other = block ? ".weight_scale" : ".weight_scale_inv";

  const int64_t r13 = block ? 2 * blocks(I) : 2, c13 = block ? blocks(H) : 1;
  const int64_t per_part13 = block ? blocks(I) * blocks(H) : 1, per_expert2 = block ? blocks(H) * blocks(I) : 1;
  out.w13_scale = block ? HostTensor(DType::kF32, {E, r13, c13}) : HostTensor(DType::kF32, {E, 2});
  out.w2_scale = block ? HostTensor(DType::kF32, {E, blocks(H), blocks(I)}) : HostTensor(DType::kF32, {E});
  if (static_act) {
    out.a13_scale = HostTensor(DType::kF32, {E});
    out.a2_scale = HostTensor(DType::kF32, {E});
  }
  for (int64_t e = 0; e < E; ++e) {
    float input_scale[3] = {0, 0, 0};
    for (int p = 0; p < 3; ++p) {
      const SafetensorsEntry& w = *experts[e][p];
      const std::string base = base_of(w);
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* s, files.find(base + own));
      if (files.contains(base + other)) {
        return InvalidArgument(base + other + ": " + base0 + " uses " + own +
                               "; one layer cannot mix the block-128 and per-tensor schemes");
      }
      if (s == nullptr) return InvalidArgument(base + own + " is missing (the scale of " + w.name + ")");
      const bool down = p == 2;
      const std::vector<int64_t> shape =
          block ? std::vector<int64_t>{blocks(w.shape[0]), blocks(w.shape[1])} : std::vector<int64_t>{1};
      MOEKIT_ASSIGN_OR_RETURN(HostTensor t, read_scale(files, *s, shape));
      float* dst = down ? out.w2_scale.data<float>() + e * per_expert2
                        : out.w13_scale.data<float>() + (e * 2 + p) * per_part13;
      std::memcpy(dst, t.data<float>(), static_cast<size_t>(down ? per_expert2 : per_part13) * sizeof(float));
      MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* in, files.find(base + ".input_scale"));
      if (static_act != (in != nullptr)) {
        return InvalidArgument(base + ".input_scale is " + (static_act ? "missing" : "present") + ", but " + base0 +
                               ".input_scale is " + (static_act ? "present" : "missing") +
                               "; static activation scales must be given for every projection or none");
      }
      if (in != nullptr) {
        MOEKIT_ASSIGN_OR_RETURN(HostTensor a, read_scale(files, *in, {1}));
        input_scale[p] = a.data<float>()[0];
      }
    }
    if (static_act) {
      // gate and up read the same input: the larger scale covers both (no saturation either saw).
      out.a13_scale.data<float>()[e] = std::max(input_scale[0], input_scale[1]);
      out.a2_scale.data<float>()[e] = input_scale[2];
    }
  }
  return out;
}

StatusOr<Fp8Scales> read_stacked_fp8_scales(TensorFiles& files, const std::string& prefix) {
  Fp8Scales out;
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* w13s, files.find(prefix + "w13_scale"));
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* w2s, files.find(prefix + "w2_scale"));
  if (w13s == nullptr) return InvalidArgument(prefix + "w13 is F8_E4M3 but " + prefix + "w13_scale is missing");
  if (w2s == nullptr) return InvalidArgument(prefix + "w2 is F8_E4M3 but " + prefix + "w2_scale is missing");
  for (const SafetensorsEntry* s : {w13s, w2s}) {
    if (s->dtype != DType::kF32) return InvalidArgument(s->name + ": scales must be F32, got " + s->dtype_name);
  }
  if (w13s->shape.size() != 3 && w13s->shape.size() != 2) {
    return InvalidArgument(w13s->name + ": expected [E, P*ceil(I/128), ceil(H/128)] (block-128) or [E, P] (per "
                           "tensor), got " + shape_text(w13s->shape));
  }
  out.method = w13s->shape.size() == 3 ? QuantMethod::kFp8Block128 : QuantMethod::kFp8PerTensor;
  MOEKIT_ASSIGN_OR_RETURN(out.w13_scale, files.read(w13s->name));
  MOEKIT_ASSIGN_OR_RETURN(out.w2_scale, files.read(w2s->name));
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* a13, files.find(prefix + "a13_scale"));
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* a2, files.find(prefix + "a2_scale"));
  if ((a13 == nullptr) != (a2 == nullptr)) {
    return InvalidArgument(prefix + (a13 ? "a2_scale" : "a13_scale") + " is missing; static activation scales come "
                           "in pairs (a13_scale, a2_scale)");
  }
  if (a13 != nullptr) {
    out.act_scale = ActScale::kStatic;
    MOEKIT_ASSIGN_OR_RETURN(out.a13_scale, files.read(a13->name));
    MOEKIT_ASSIGN_OR_RETURN(out.a2_scale, files.read(a2->name));
  }
  return out;
}

}  // namespace moekit::io
