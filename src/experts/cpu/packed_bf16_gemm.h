// The packed expert GEMMs of the CPU backend: the weights are packed once in
// prepare into panels made for AVX-512 (layout in packed_bf16_gemm_avx512.h;
// an AVX2 kernel reads the same panels, packed_bf16_gemm_avx2.h), with no
// repacking per call.
// - bf16 weights stay bf16, half the bytes that fp32 copies would stream per
//   call; the kernel widens them in registers (exact).
// - f32 weights (and fp8 or 4-bit weights, dequantized to f32 once) are packed
//   as f32 lines. Unlike sgemm, which runs on OpenBLAS's threads (or, with
//   those at one thread, on the calling thread alone), the GEMM runs on
//   moekit's parallel_for pool, the one the rest of the layer runs on, so
//   inside torch it shares torch's OpenMP threads instead of competing with
//   them.
// Both multiply with fp32 FMAs against the fp32 A rows: sgemm's arithmetic,
// fp32 products and accumulation, A not rounded.
//
// Only for CPUs where packed_gemm_supported() is true; elsewhere the backend
// keeps the OpenBLAS path of cpu_gemm.h (see cpu_gemm_path()).
#pragma once

#include <cstdint>
#include <memory>

#include "experts/cpu/packed_bf16_gemm_avx2.h"
#include "experts/cpu/packed_bf16_gemm_avx512.h"

namespace moekit::cpu {

// This CPU (and its OS) runs one of the kernels: AVX-512, else AVX2 with FMA.
bool packed_gemm_supported();
// "AVX-512" or "AVX2": the kernel it runs (null when none).
const char* packed_gemm_isa();

// A stack of expert weight matrices [E, N, K] in the packed layout, of T =
// uint16_t (bf16 bits, lanes as PackedBf16Layout says) or float (columns in order).
template <typename T>
class PackedWeights {
 public:
  // w: [E, N, K] host array, contiguous, row-major.
  void assign(const T* w, int64_t num_experts, int64_t n, int64_t k);
  bool empty() const { return data_ == nullptr; }
  int64_t num_experts() const { return num_experts_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t panels() const { return panels_; }
  // Panel p of expert e: [K, kPanelCols] T, 64-byte aligned.
  const T* panel(int64_t e, int64_t p) const;

 private:
  struct alignas(64) Line {
    T v[PackedBf16Layout::kPanelCols];
  };
  int64_t num_experts_ = 0, n_ = 0, k_ = 0, panels_ = 0;
  size_t lines_ = 0;  // of data_
  // [E, panels, K] lines of kPanelCols T; zero beyond N. Not value-initialized:
  // assign() writes every line in parallel (one pass, its page faults spread over the threads).
  std::unique_ptr<Line[]> data_;
};
using PackedBf16Weights = PackedWeights<uint16_t>;
using PackedF32Weights = PackedWeights<float>;
extern template class PackedWeights<uint16_t>;
extern template class PackedWeights<float>;

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
// stream different weights. Needs packed_gemm_supported().
template <typename T>
void grouped_gemm_packed(const float* a, int64_t lda, const int32_t* offsets, const PackedWeights<T>& w, float* c,
                         int64_t ldc, int32_t* active);

}  // namespace moekit::cpu
