// One stack of weight matrices [E, N, K] laid out for the CPU GEMM path of a
// config (cpu_gemm_path()), and the grouped GEMM over it. The experts stage
// keeps its w13 and w2 this way, and the shared expert its two matrices
// (E = 1), so both run on the same kernels and the same threads.
#pragma once

#include <cstdint>

#include "experts/cpu/cpu_gemm.h"
#include "experts/cpu/packed_bf16_gemm.h"

namespace moekit::cpu {

class GemmWeights {
 public:
  // kPackedBf16: w is the bf16 source [E, N, K] (bits), packed as it is.
  void assign_bf16(const uint16_t* w, int64_t num_experts, int64_t n, int64_t k);
  // kBlasF32 (kept) or kPackedF32 (packed): w holds [E, N, K] as f32.
  void assign_f32(CpuGemmPath path, ExpertWeightsF32&& w, int64_t num_experts, int64_t n, int64_t k);
  bool empty() const { return num_experts_ == 0; }
  CpuGemmPath path() const { return path_; }

  // c[r, :N] = a[r, :K] . W_e^T for every row r in [offsets[e], offsets[e + 1]):
  //   a [offsets[E], lda] f32, c [offsets[E], ldc] f32, offsets [E + 1] i32,
  //   active [E] i32 scratch (packed paths). batch_invariant: the BLAS path in
  //   its fixed order (the packed paths already sum in one order for every M).
  void gemm(const float* a, int64_t lda, const int32_t* offsets, float* c, int64_t ldc, int32_t* active,
            bool batch_invariant) const;

 private:
  CpuGemmPath path_ = CpuGemmPath::kBlasF32;
  int64_t num_experts_ = 0, n_ = 0, k_ = 0;
  ExpertWeightsF32 f32_;      // kBlasF32
  PackedBf16Weights bf16_;    // kPackedBf16
  PackedF32Weights packed_;   // kPackedF32
};

}  // namespace moekit::cpu
