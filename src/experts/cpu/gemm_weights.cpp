#include "experts/cpu/gemm_weights.h"

#include <utility>

namespace moekit::cpu {

void GemmWeights::assign_bf16(const uint16_t* w, int64_t num_experts, int64_t n, int64_t k) {
  *this = {};
  path_ = CpuGemmPath::kPackedBf16;
  bf16_.assign(w, num_experts, n, k);
  num_experts_ = num_experts;
  n_ = n;
  k_ = k;
}

void GemmWeights::assign_f32(CpuGemmPath path, ExpertWeightsF32&& w, int64_t num_experts, int64_t n, int64_t k) {
  *this = {};
  path_ = path;
  if (path == CpuGemmPath::kPackedF32) {
    packed_.assign(w.data(), num_experts, n, k);
  } else {
    f32_ = std::move(w);
  }
  num_experts_ = num_experts;
  n_ = n;
  k_ = k;
}

void GemmWeights::gemm(const float* a, int64_t lda, const int32_t* offsets, float* c, int64_t ldc, int32_t* active,
                       bool batch_invariant) const {
  switch (path_) {
    case CpuGemmPath::kBlasF32:
      // NOTE: expert by expert, each on OpenBLAS's threads; the calls (and so
      // the results) depend only on the offsets, never on timing.
      for (int64_t e = 0; e < num_experts_; ++e) {
        const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
        if (rows == 0) continue;
        const auto blas = batch_invariant ? gemm_abt_fixed_order : gemm_abt;
        blas(a + r0 * lda, lda, f32_.data() + e * n_ * k_, k_, c + r0 * ldc, ldc, rows, n_, k_);
      }
      return;
    case CpuGemmPath::kPackedBf16: grouped_gemm_packed(a, lda, offsets, bf16_, c, ldc, active); return;
    case CpuGemmPath::kPackedF32: grouped_gemm_packed(a, lda, offsets, packed_, c, ldc, active); return;
  }
}

}  // namespace moekit::cpu
