// The shared expert of a layer (Qwen2-MoE, DeepSeek-V3): one dense MLP with the
// layer's activation on every token, its output times a gate added to the
// routed sum in fp32, before the output is narrowed. The CPU experts stage runs
// it after its reduce; an expert-parallel host rank runs it on its own tokens
// after the combine, through this same code, so the two agree bit for bit
// wherever the GEMMs do (batch-invariant mode: a row's result does not depend
// on the other rows). Its two GEMMs run on the routed experts' path
// (cpu_gemm_path()), as one expert.
#pragma once

#include <cstdint>

#include "experts/cpu/cpu_gemm.h"
#include "experts/cpu/gemm_weights.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cpu {

class CpuSharedExpert {
 public:
  // With config.shared_intermediate = Is > 0: shared_w13 [n1s, H] and shared_w2
  // [H, Is] in the weight dtype (n1s = 2 Is gated, Is for relu2), and shared_gate
  // [H] (f32 or the weight dtype) iff config.has_shared_gate; without a shared
  // expert, none of them. Errors name the tensor (NaN or Inf weights included).
  Status prepare(const MoeConfig& config, const MoeWeights& weights);
  bool present() const { return intermediate_ > 0; }
  int64_t gemm1_width() const;

  // y[t] += g_t * shared(x[t]) for t in [0, m), g_t = sigmoid(x[t] . gate)
  // (ascending columns) when gated, else 1. x: [m, H] f32; y: [m, H] f32;
  // scratch h [m, gemm1_width()] and s [m, H] f32.
  void add_to(const float* x, int64_t m, float* y, float* h, float* s) const;

 private:
  int64_t hidden_ = 0, intermediate_ = 0;
  ActivationConfig activation_;
  bool batch_invariant_ = false;
  GemmWeights w13_;        // [1, n1s, H], on the routed experts' GEMM path
  GemmWeights w2_;         // [1, H, Is]
  ExpertWeightsF32 gate_;  // [H] f32, or empty
};

}  // namespace moekit::cpu
