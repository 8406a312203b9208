#include "experts/cpu/shared_expert.h"

#include <cmath>
#include <string>
#include <utility>

#include "experts/cpu/activations.h"
#include "experts/quant_weights.h"
#include "moekit/parallel_for.h"

namespace moekit::cpu {

int64_t CpuSharedExpert::gemm1_width() const { return cpu::gemm1_width(activation_.kind, intermediate_); }

Status CpuSharedExpert::prepare(const MoeConfig& config, const MoeWeights& weights) {
  const int64_t H = config.hidden, Is = config.shared_intermediate;
  const DType wt = config.quant.weight_dtype;
  const bool shared = Is > 0;
  const auto check = [&](const TensorView& t, const char* name, bool wanted, const char* flag,
                         std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape) -> Status {
    if (wanted) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(t, name, dtypes, shape, Device::cpu()));
      return check_weight_values(t, name);  // NaN or Inf weights would return NaN rows
    }
    if (t.defined()) return InvalidArgument(std::string(name) + ": given, but " + flag + " is off in the config");
    return Status::Ok();
  };
  MOEKIT_RETURN_IF_ERROR(check(weights.shared_w13, "shared_w13", shared, "shared_intermediate", {wt},
                               {cpu::gemm1_width(config.activation.kind, Is), H}));
  MOEKIT_RETURN_IF_ERROR(check(weights.shared_w2, "shared_w2", shared, "shared_intermediate", {wt}, {H, Is}));
  MOEKIT_RETURN_IF_ERROR(check(weights.shared_gate, "shared_gate", config.has_shared_gate, "has_shared_gate",
                               {DType::kF32, wt}, {H}));
  hidden_ = H;
  intermediate_ = Is;
  activation_ = config.activation;
  batch_invariant_ = config.batch_invariant;
  gate_ = {};
  if (weights.shared_gate.defined()) gate_.assign(weights.shared_gate);
  w13_ = {};
  w2_ = {};
  if (!shared) return Status::Ok();
  // The routed experts' GEMM path, as one expert (E = 1) of rows [0, m).
  const CpuGemmPath path = cpu_gemm_path(config);
  const int64_t n1s = gemm1_width();
  if (path == CpuGemmPath::kPackedBf16) {
    w13_.assign_bf16(weights.shared_w13.ptr<const uint16_t>(), 1, n1s, H);
    w2_.assign_bf16(weights.shared_w2.ptr<const uint16_t>(), 1, H, Is);
  } else {
    ExpertWeightsF32 w13, w2;
    w13.assign(weights.shared_w13);
    w2.assign(weights.shared_w2);
    w13_.assign_f32(path, std::move(w13), 1, n1s, H);
    w2_.assign_f32(path, std::move(w2), 1, H, Is);
  }
  return Status::Ok();
}

void CpuSharedExpert::add_to(const float* x, int64_t m, float* y, float* h, float* s) const {
  if (m == 0 || !present()) return;
  const int64_t H = hidden_, Is = intermediate_, n1s = gemm1_width();
  const int32_t rows[2] = {0, static_cast<int32_t>(m)};  // one expert: every token
  int32_t active[1];
  w13_.gemm(x, H, rows, h, n1s, active, batch_invariant_);
  apply_activation(activation_, h, m, Is);
  w2_.gemm(h, n1s, rows, s, H, active, batch_invariant_);
  parallel_for(m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float g = 1.0f;
      if (!gate_.empty()) {
        float dot = 0.0f;  // ascending column order
        for (int64_t c = 0; c < H; ++c) dot += x[t * H + c] * gate_.data()[c];
        g = 1.0f / (1.0f + std::exp(-dot));
      }
      const float* src = s + t * H;
      float* out = y + t * H;
      for (int64_t c = 0; c < H; ++c) out[c] += g * src[c];
    }
  });
}

}  // namespace moekit::cpu
