// The expert GEMMs of the CPU backend, on OpenBLAS sgemm (fp32 in, fp32
// accumulation). Weights are kept as fp32 copies made once in prepare_weights
// (see ExpertWeightsF32): sgemm packs its operands itself, and widening bf16 per
// call would add a pass over all weights to every layer call.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

// c[m, n] = a[m, :k] . b[n, :k]^T, all row-major fp32 with leading dimensions
// lda, ldb, ldc (elements). b is a weight matrix stored [n, k] as checkpoints
// store it, so no transpose copy is needed. Threads: OpenBLAS's own.
void gemm_abt(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
              int64_t n, int64_t k);

// A weight tensor widened to fp32 once (bf16 -> f32 is exact). Memory: 4 bytes
// per element regardless of the checkpoint dtype, i.e. twice a bf16 checkpoint;
// the price of handing sgemm fp32 operands without a per-call conversion pass.
class ExpertWeightsF32 {
 public:
  // src: f32|bf16 host tensor, contiguous.
  void assign(const TensorView& src);
  const float* data() const { return data_.data(); }
  bool empty() const { return data_.empty(); }

 private:
  std::vector<float> data_;  // same shape as the source, f32
};

}  // namespace moekit::cpu
