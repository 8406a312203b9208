// The experts stage of the CPU backend (docs/design.md §1, Experts.apply):
// permute rows by expert -> GEMM1 -> activation -> GEMM2 -> weighted top-k
// reduce. Both CPU kernels (modular and monolithic) run exactly this code, in
// this order, which is what makes their outputs bitwise equal.
#pragma once

#include <cstdint>
#include <vector>

#include "experts/cpu/cpu_gemm.h"
#include "experts/cpu/gemm_weights.h"
#include "experts/cpu/scratch_layout.h"
#include "experts/cpu/shared_expert.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cpu {

class CpuExperts {
 public:
  // Validates the expert weights, w13 [E, 2I, H] (gated) or [E, I, H] (relu2),
  // w2 [E, H, I], both in the config's weight dtype, and for the fp8 schemes
  // their scales (errors name the tensor), and keeps them as
  // cpu_gemm_path(config) needs (GemmWeights): packed bf16, or widened to fp32
  // (fp8 and 4-bit weights dequantized) and then packed or kept for BLAS.
  // With config.has_expert_bias, w13_bias [E, n1] and w2_bias [E, H] (f32 or
  // the weight dtype) are kept in fp32; a shared expert's weights are laid out
  // for the same path (shared_expert.h).
  Status prepare(const MoeConfig& config, const MoeWeights& weights);
  bool prepared() const { return !w13_.empty(); }
  CpuGemmPath gemm_path() const { return path_; }

  // Reserves this stage's scratch for `num_tokens` tokens in `layout`, for
  // cpu_gemm_path(config); with a real base, fills `buffers`. Call once per
  // layout, in a fixed position.
  struct Buffers {
    int32_t* expert_offsets = nullptr;  // [E + 1] i32
    int32_t* row_to_pair = nullptr;     // [M * k] i32
    int32_t* pair_to_row = nullptr;     // [M * k] i32
    float* x_perm = nullptr;            // [M * k, H] f32: token rows grouped by expert
    float* h = nullptr;                 // [M * k, n1] f32: GEMM1 out; activation written over cols [0, I)
    float* y_perm = nullptr;            // [M * k, H] f32: GEMM2 out, per (token, slot)
    int32_t* active = nullptr;          // [E] i32: experts with rows (packed paths only)
    float* shared_h = nullptr;          // [M, n1s] f32: shared GEMM1 out (shared expert only)
    float* shared_y = nullptr;          // [M, H] f32: shared expert output (shared expert only)
  };
  static Buffers take_buffers(const MoeConfig& config, int64_t num_tokens, ScratchLayout& layout);

  // x: [M, H] f32; ids: [M, k] i32 validated (in [0, E), no duplicate in a row);
  // topk_weights: [M, k] f32; y: [M, H] f32, every element written:
  //   y[t] = sum over j = 0..k-1, in this order, of topk_weights[t, j] * expert_{ids[t, j]}(x[t]),
  // fp32 accumulation starting from 0, where expert_e(x) = W2[e] act(W13[e] x + b13[e]) + b2[e]
  // (biases when configured); then, with a shared expert, y[t] += g_t * shared(x[t]),
  // g_t = sigmoid(x[t] . shared_gate) when gated, else 1.
  void apply(const float* x, const int32_t* ids, const float* topk_weights, int64_t num_tokens, float* y,
             const Buffers& buffers) const;

 private:
  // fp8 schemes: GEMM input rows [0, rows) (cols wide, stride ld, grouped by
  // expert as b.expert_offsets says) rounded through e4m3 in place, with the
  // scheme's activation scales; `static_scale`: a13_scale_ or a2_scale_.
  void quantize_gemm_input(float* a, int64_t rows, int64_t cols, int64_t ld, const std::vector<float>& static_scale,
                           const Buffers& b) const;

  int64_t num_experts_ = 0, hidden_ = 0, intermediate_ = 0, top_k_ = 0;
  ActivationConfig activation_;
  QuantScheme quant_;
  std::vector<float> a13_scale_, a2_scale_;  // [E] f32: fp8_per_tensor static activation scales, else empty
  CpuGemmPath path_ = CpuGemmPath::kBlasF32;
  bool batch_invariant_ = false;  // kBlasF32: gemm_abt_fixed_order instead of sgemm
  GemmWeights w13_;               // [E, n1, H], n1 = 2I (gated) or I (relu2)
  GemmWeights w2_;                // [E, H, I]
  ExpertWeightsF32 w13_bias_;     // [E, n1] f32, or empty
  ExpertWeightsF32 w2_bias_;      // [E, H] f32, or empty
  CpuSharedExpert shared_;        // y += g * shared(x) after the reduce, when the layer has one
};

}  // namespace moekit::cpu
