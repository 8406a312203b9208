// The AVX-512 micro-kernel of the packed bf16 expert GEMM (packed_bf16_gemm.h)
// and the weight layout it reads. Only packed_bf16_gemm_avx512.cpp is compiled
// for AVX-512; call the kernel only when packed_gemm_supported() says the
// CPU runs it.
//
// This header holds plain declarations and constants only (no inline code), so
// it is safe to include on both sides of the instruction-set boundary.
#pragma once

#include <cstdint>

namespace moekit::cpu {

// Packed weight layout. A weight matrix W [N, K] (bf16, as checkpoints store
// it) becomes ceil(N / kPanelCols) panels; panel p holds columns
// n0 = p * kPanelCols .. n0 + 31 as K lines of 64 bytes, one per k:
//   line k, 32-bit lane j (j < 16) = bf16 W[n0 + j, k] in the high half,
//                                    bf16 W[n0 + 16 + j, k] in the low half.
// One AND and one shift turn a line into the fp32 values of both 16-column
// halves (a bf16 is the high half of its fp32), so the kernel multiplies with
// plain fp32 FMAs. Columns >= N are zero. Every panel starts on a 64-byte
// boundary.
struct PackedBf16Layout {
  static constexpr int64_t kPanelCols = 32;  // one 64-byte line of bf16 per k
  // Rows per register tile: kMaxTileRows * 2 accumulators, the two widened
  // weight vectors and the AND mask must fit the 32 zmm registers.
  static constexpr int64_t kMaxTileRows = 14;
  static_assert(kPanelCols == 32, "a line is 16 lanes of two bf16");
  static_assert(kMaxTileRows * 2 + 3 <= 32, "tile exceeds the zmm registers");
};

// One panel: c[r, 0..cols) = sum over k < K of a[r, k] * W[n0 + j, k], for
// r < rows, fp32 FMAs in ascending k (one rounding per step, as sgemm's fp32
// arithmetic; the bf16 weights widen exactly).
//   a:     [rows, lda] f32
//   panel: one panel of the layout above (64-byte aligned), K lines
//   c:     [rows, ldc] f32; only columns [0, cols) are written, cols <= kPanelCols
// Rows are processed in register tiles of at most kMaxTileRows; the panel is
// streamed from memory once and re-read from cache for the later tiles.
void packed_bf16_panel_avx512(const float* a, int64_t lda, int64_t rows, const uint16_t* panel, int64_t k,
                              float* c, int64_t ldc, int64_t cols);

// The same for an f32 panel: K lines of kPanelCols f32 (128 bytes, 64-byte
// aligned), columns n0 .. n0 + 31 in order; the same FMAs in the same order.
void packed_f32_panel_avx512(const float* a, int64_t lda, int64_t rows, const float* panel, int64_t k, float* c,
                             int64_t ldc, int64_t cols);

}  // namespace moekit::cpu
