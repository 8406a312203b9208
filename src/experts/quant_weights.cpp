#include "experts/quant_weights.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include "core/weight4.h"
#include "moekit/parallel_for.h"

namespace moekit {
namespace {
int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

Status must_be_absent(const TensorView& t, const char* name, const QuantScheme& q) {
  if (!t.defined()) return Status::Ok();
  return InvalidArgument(std::string(name) + ": given, but quant " + q.to_string() + " takes no such scale");
}
}  // namespace

int64_t w13_parts(const ActivationConfig& activation) { return activation.gated() ? 2 : 1; }

Status check_scale_values(const TensorView& scale, const char* name) {
  const float* s = scale.ptr<const float>();
  const int64_t n = scale.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(s[i]) || !(s[i] > 0.0f)) {
      return InvalidArgument(std::string(name) + ": element " + std::to_string(i) + " is " + std::to_string(s[i]) +
                             "; scales must be finite and > 0");
    }
  }
  return Status::Ok();
}

namespace {

// The first i in [0, n) with bad(i), or -1; the scan is split over the
// parallel_for pool (weights are gigabytes), the answer independent of it.
template <typename Bad>
int64_t first_bad_index(int64_t n, const Bad& bad) {
  constexpr int64_t kBlock = 4096;  // scanned branch-free (vectorized), then searched only when it has one
  std::atomic<int64_t> first{INT64_MAX};
  parallel_for(n, int64_t{1} << 20, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end && b < first.load(std::memory_order_relaxed); b += kBlock) {
      const int64_t e = std::min(end, b + kBlock);
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= bad(i);
      if (!any) continue;
      int64_t i = b;
      while (!bad(i)) ++i;
      int64_t seen = first.load(std::memory_order_relaxed);
      while (i < seen && !first.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
      }
      return;
    }
  });
  const int64_t f = first.load();
  return f == INT64_MAX ? -1 : f;
}

}  // namespace

Status check_weight_values(const TensorView& w, const char* name) {
  if (!w.defined() || w.device.type != DeviceType::kCpu) return Status::Ok();
  const int64_t n = w.numel();
  int64_t bad = -1;
  bool nan = true;
  switch (w.dtype) {
    case DType::kF32: {
      const float* p = w.ptr<const float>();
      bad = first_bad_index(n, [p](int64_t i) { return !std::isfinite(p[i]); });
      if (bad >= 0) nan = std::isnan(p[bad]);
      break;
    }
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t* p = w.ptr<const uint16_t>();
      const uint16_t exp = w.dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;  // exponent all ones: Inf or NaN
      bad = first_bad_index(n, [p, exp](int64_t i) { return (p[i] & exp) == exp; });
      if (bad >= 0) nan = (p[bad] & 0x7fffu) != exp;
      break;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = w.ptr<const uint8_t>();
      bad = first_bad_index(n, [p](int64_t i) { return (p[i] & 0x7fu) == 0x7fu; });  // e4m3fn: S.1111.111 is NaN
      break;
    }
    default: return Status::Ok();
  }
  if (bad < 0) return Status::Ok();
  return non_finite_weight_error(w, name, bad, nan);
}

Status non_finite_weight_error(const TensorView& w, const char* name, int64_t bad, bool nan) {
  std::string index;
  int64_t rest = bad;
  for (int d = w.rank - 1; d >= 0; --d) {
    const int64_t dim = w.shape[d] > 0 ? w.shape[d] : 1;
    index = std::to_string(rest % dim) + (index.empty() ? "" : ", ") + index;
    rest /= dim;
  }
  return InvalidArgument(std::string(name) + ": element [" + index + "] (flat index " + std::to_string(bad) + ") is " +
                         (nan ? "NaN" : "infinite") + "; weights must be finite");
}

Status check_weight4_weights(QuantMethod method, const MoeWeights& w) {
  for (const auto& [t, s, name] : {std::tuple{&w.w13, &w.w13_scale, "w13"}, std::tuple{&w.w2, &w.w2_scale, "w2"}}) {
    if (!t->defined() || t->device.type != DeviceType::kCpu) continue;  // device weights: their caller checks copies
    MOEKIT_RETURN_IF_ERROR(check_weight4_range(method, *t, *s, name, std::string(name) + "_scale"));
  }
  return Status::Ok();
}

Status check_quant_scales(const MoeConfig& c, const MoeWeights& w, Device device) {
  const QuantScheme& q = c.quant;
  const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate, P = w13_parts(c.activation);
  const bool static_act = q.method == QuantMethod::kFp8PerTensor && q.act_scale == ActScale::kStatic;
  switch (q.method) {
    case QuantMethod::kNone:
      MOEKIT_RETURN_IF_ERROR(must_be_absent(w.w13_scale, "w13_scale", q));
      MOEKIT_RETURN_IF_ERROR(must_be_absent(w.w2_scale, "w2_scale", q));
      break;
    case QuantMethod::kFp8Block128:
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13_scale, "w13_scale", {DType::kF32}, {E, P * blocks(I), blocks(H)}, device));
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2_scale, "w2_scale", {DType::kF32}, {E, blocks(H), blocks(I)}, device));
      break;
    case QuantMethod::kFp8PerTensor:
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13_scale, "w13_scale", {DType::kF32}, {E, P}, device));
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2_scale, "w2_scale", {DType::kF32}, {E}, device));
      break;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: {
      // One scale per group of input columns of every row (docs/weights_4bit.md).
      const int64_t g = weight4_group(q.method), n1 = P * I;
      const DType sd = weight4_scale_dtype(q.method);
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13_scale, "w13_scale", {sd}, {E, n1, H / g}, device));
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2_scale, "w2_scale", {sd}, {E, H, I / g}, device));
      // Weight-only: the activations are not quantized, so a static activation scale would be ignored.
      MOEKIT_RETURN_IF_ERROR(must_be_absent(w.a13_scale, "a13_scale", q));
      MOEKIT_RETURN_IF_ERROR(must_be_absent(w.a2_scale, "a2_scale", q));
      if (device.type == DeviceType::kCpu) {
        MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(q.method, w.w13_scale, "w13_scale"));
        MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(q.method, w.w2_scale, "w2_scale"));
        MOEKIT_RETURN_IF_ERROR(check_weight4_weights(q.method, w));
      }
      return Status::Ok();
    }
  }
  if (static_act) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.a13_scale, "a13_scale", {DType::kF32}, {E}, device));
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.a2_scale, "a2_scale", {DType::kF32}, {E}, device));
  } else {
    MOEKIT_RETURN_IF_ERROR(must_be_absent(w.a13_scale, "a13_scale", q));
    MOEKIT_RETURN_IF_ERROR(must_be_absent(w.a2_scale, "a2_scale", q));
  }
  if (device.type == DeviceType::kCpu) {
    const std::pair<const TensorView*, const char*> all[] = {
        {&w.w13_scale, "w13_scale"}, {&w.w2_scale, "w2_scale"}, {&w.a13_scale, "a13_scale"}, {&w.a2_scale, "a2_scale"}};
    for (const auto& [t, name] : all) {
      if (t->defined()) MOEKIT_RETURN_IF_ERROR(check_scale_values(*t, name));
    }
  }
  return Status::Ok();
}

}  // namespace moekit
