// The expert GEMMs of the CPU backend for bf16 weights: the weights are packed
// once in prepare_weights into panels made for AVX-512 (layout in
// packed_bf16_gemm_avx512.h; an AVX2 kernel reads the same panels,
// packed_bf16_gemm_avx2.h) and stay bf16, half the bytes that sgemm's fp32
// copies stream per call, with no repacking per call. The kernel widens them
// in registers (exact) and multiplies with fp32 FMAs against the fp32 A rows,
// so the arithmetic is sgemm's: fp32 products and accumulation, A not rounded.
//
// Only for CPUs where packed_bf16_gemm_supported() is true; elsewhere the
// backend keeps the OpenBLAS path of cpu_gemm.h (see cpu_gemm_path()).
#pragma once

#include <cstdint>
#include <memory>

#include "experts/cpu/packed_bf16_gemm_avx2.h"
#include "experts/cpu/packed_bf16_gemm_avx512.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

// This CPU (and its OS) runs one of the kernels: AVX-512, else AVX2 with FMA.
bool packed_bf16_gemm_supported();
// "AVX-512" or "AVX2": the kernel it runs (null when none).
const char* packed_bf16_gemm_isa();

// A stack of expert weight matrices [E, N, K] in the packed layout.
class PackedBf16Weights {
 public:
  // src: bf16 [E, N, K] host tensor, contiguous.
  void assign(const TensorView& src);
  bool empty() const { return data_ == nullptr; }
  int64_t num_experts() const { return num_experts_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t panels() const { return panels_; }
  // Panel p of expert e: [K, kPanelCols] bf16 (lanes as the layout says), 64-byte aligned.
  const uint16_t* panel(int64_t e, int64_t p) const;

 private:
  struct alignas(64) Line {
    uint16_t v[PackedBf16Layout::kPanelCols];
  };
  int64_t num_experts_ = 0, n_ = 0, k_ = 0, panels_ = 0;
  size_t lines_ = 0;  // of data_
  // [E, panels, K] lines of kPanelCols bf16; zero beyond N. Not value-initialized:
  // assign() writes every line in parallel (one pass, its page faults spread over the threads).
  std::unique_ptr<Line[]> data_;
};

// The grouped expert GEMM: for every expert e and every row r in
// [offsets[e], offsets[e + 1]):
//   c[r, n] = sum over k of a[r, k] * W_e[n, k]   for n < N,
// fp32 FMAs in ascending k per element, so the result depends on nothing but
// the inputs (not on threads or timing).
//   a:       [offsets[E], lda] f32, lda >= K
//   offsets: [E + 1] i32, non-decreasing from 0
//   c:       [offsets[E], ldc] f32, ldc >= N; columns >= N are not written
//   active:  [E] i32 scratch (the experts that have rows)
// Parallel over (expert, panel) tasks on the parallel_for pool, so the threads
// stream different weights. Needs packed_bf16_gemm_supported().
void grouped_gemm_packed_bf16(const float* a, int64_t lda, const int32_t* offsets, const PackedBf16Weights& w,
                              float* c, int64_t ldc, int32_t* active);

}  // namespace moekit::cpu
