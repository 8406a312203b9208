// The experts stage of the CPU backend (DESIGN.md §1, Experts.apply):
// permute rows by expert -> GEMM1 -> activation -> GEMM2 -> weighted top-k
// reduce. Both CPU kernels (modular and monolithic) run exactly this code, in
// this order, which is what makes their outputs bitwise equal.
#pragma once

#include <cstdint>

#include "experts/cpu/cpu_gemm.h"
#include "experts/cpu/scratch_layout.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cpu {

class CpuExperts {
 public:
  // Validates and widens the expert weights to fp32 (see ExpertWeightsF32):
  // w13 [E, 2I, H] (gated) or [E, I, H] (relu2), w2 [E, H, I], both in the
  // config's weight dtype. Errors name the tensor.
  Status prepare(const MoeConfig& config, const TensorView& w13, const TensorView& w2);
  bool prepared() const { return !w13_.empty(); }

  // Reserves this stage's scratch for `num_tokens` tokens in `layout`; with a
  // real base, fills `buffers`. Call once per layout, in a fixed position.
  struct Buffers {
    int32_t* expert_offsets = nullptr;  // [E + 1] i32
    int32_t* row_to_pair = nullptr;     // [M * k] i32
    int32_t* pair_to_row = nullptr;     // [M * k] i32
    float* x_perm = nullptr;            // [M * k, H] f32: token rows grouped by expert
    float* h = nullptr;                 // [M * k, n1] f32: GEMM1 out; activation written over cols [0, I)
    float* y_perm = nullptr;            // [M * k, H] f32: GEMM2 out, per (token, slot)
  };
  static Buffers take_buffers(const MoeConfig& config, int64_t num_tokens, ScratchLayout& layout);

  // x: [M, H] f32; ids: [M, k] i32 validated (in [0, E), no duplicate in a row);
  // topk_weights: [M, k] f32; y: [M, H] f32, every element written:
  //   y[t] = sum over j = 0..k-1, in this order, of topk_weights[t, j] * expert_{ids[t, j]}(x[t]),
  // fp32 accumulation starting from 0.
  void apply(const float* x, const int32_t* ids, const float* topk_weights, int64_t num_tokens, float* y,
             const Buffers& buffers) const;

 private:
  int64_t num_experts_ = 0, hidden_ = 0, intermediate_ = 0, top_k_ = 0;
  ActivationConfig activation_;
  ExpertWeightsF32 w13_;  // [E, n1, H] f32, n1 = 2I (gated) or I (relu2)
  ExpertWeightsF32 w2_;   // [E, H, I] f32
};

}  // namespace moekit::cpu
