// The expert GEMMs of the CPU backend: which path a config takes, and the
// OpenBLAS path, sgemm (fp32 in, fp32 accumulation). That path keeps fp32
// copies of the weights made once in prepare_weights (see ExpertWeightsF32):
// sgemm packs its operands itself, and widening bf16 per call would add a pass
// over all weights to every layer call. The packed paths, for CPUs with
// AVX-512F or AVX2 + FMA, are in packed_bf16_gemm.h.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/config.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

enum class CpuGemmPath {
  kBlasF32,     // OpenBLAS sgemm on fp32 weight copies
  kPackedBf16,  // packed bf16 weights, AVX-512 or AVX2 fp32 FMAs (packed_bf16_gemm.h)
  kPackedF32,   // packed f32 weights (f32, or fp8/4-bit dequantized once), the same kernels
};
const char* cpu_gemm_path_name(CpuGemmPath path);  // "blas_f32", "packed_bf16", "packed_f32"

// The path of a config: where packed_gemm_supported(), kPackedBf16 for bf16
// weights and kPackedF32 for every other weight dtype; else kBlasF32. All
// compute fp32 products of the same values with fp32 accumulation (they differ
// only in summation order). kernel.cpu_gemm = "blas" (MOEKIT_CPU_GEMM=blas in
// the environment) forces kBlasF32 (to compare or test the fallback).
CpuGemmPath cpu_gemm_path(const MoeConfig& config);

// c[m, n] = a[m, :k] . b[n, :k]^T, all row-major fp32 with leading dimensions
// lda, ldb, ldc (elements). b is a weight matrix stored [n, k] as checkpoints
// store it, so no transpose copy is needed. Threads: OpenBLAS's own.
void gemm_abt(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
              int64_t n, int64_t k);

// The same product with one summation order for every m: each c[i, j] is a
// sequential fp32 sum over k (no FMA contraction is relied on either way), rows
// split over the thread pool. What batch_invariant mode uses instead of sgemm,
// whose blocking (and so rounding) may change with m.
void gemm_abt_fixed_order(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                          int64_t m, int64_t n, int64_t k);

// A weight tensor widened to fp32 once (bf16 -> f32 is exact). Memory: 4 bytes
// per element regardless of the checkpoint dtype, i.e. twice a bf16 checkpoint;
// the price of handing sgemm fp32 operands without a per-call conversion pass.
class ExpertWeightsF32 {
 public:
  // src: f32|bf16 host tensor, contiguous.
  void assign(const TensorView& src);
  // src: [E, N, K] e4m3 host tensor with its checked scales (quant_weights.h),
  // dequantized once (fp8_emulation.h, dequantize_fp8_weights).
  void assign_fp8(QuantMethod method, const TensorView& src, const TensorView& scale, int64_t parts);
  // src: [E, N, K/2] packed 4-bit host tensor with its checked scales
  // [E, N, K/group] (core/weight4.h), dequantized once, exactly.
  void assign_weight4(QuantMethod method, const TensorView& src, const TensorView& scale);
  const float* data() const { return data_.data(); }
  bool empty() const { return data_.empty(); }

 private:
  std::vector<float> data_;  // same shape as the source, f32
};

}  // namespace moekit::cpu
