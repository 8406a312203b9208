#include "experts/cpu/packed_bf16_gemm_avx512.h"

#include <immintrin.h>

// NOTE: the instruction set is raised for the functions below only (target
// pragma, popped at the end), and nothing with inline code is included after
// it, so no AVX-512 code can end up in functions other files share. The
// library therefore runs on any x86-64 CPU; callers check
// packed_gemm_supported() before calling in. Clang ignores GCC's target
// pragma; its attribute pragma does the same.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif

namespace moekit::cpu {
namespace {

using L = PackedBf16Layout;
// Lines (k steps) ahead to prefetch: the first tile of a panel streams it from
// memory, and the hardware prefetcher alone leaves that stream latency bound.
constexpr int64_t kPrefetchLines = 32;

// The two 16-column halves of panel line kk as fp32: a bf16 line (64 bytes)
// widened (exact), or an f32 line (128 bytes) as stored; and the prefetch of
// the line kPrefetchLines ahead (every 64-byte cache line of it).
inline void load_line(const uint16_t* panel, int64_t kk, __m512& b0, __m512& b1) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  _mm_prefetch(reinterpret_cast<const char*>(panel + (kk + kPrefetchLines) * L::kPanelCols), _MM_HINT_T0);
  const __m512i line = _mm512_load_si512(panel + kk * L::kPanelCols);  // 64-byte aligned
  b0 = _mm512_castsi512_ps(_mm512_and_si512(line, high_half));        // columns 0..15
  // (maskz with a full mask: the plain form trips a GCC 12 uninitialized warning)
  b1 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, line, 16));  // columns 16..31
}
inline void load_line(const float* panel, int64_t kk, __m512& b0, __m512& b1) {
  const float* ahead = panel + (kk + kPrefetchLines) * L::kPanelCols;
  _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(ahead + 16), _MM_HINT_T0);
  b0 = _mm512_load_ps(panel + kk * L::kPanelCols);  // columns 0..15
  b1 = _mm512_load_ps(panel + kk * L::kPanelCols + 16);  // columns 16..31
}

// One register tile: ROWS rows x 32 columns, all of K.
template <int ROWS, typename W>
void tile(const float* a, int64_t lda, const W* panel, int64_t k, float* c, int64_t ldc, __mmask16 mask_lo,
          __mmask16 mask_hi) {
  __m512 acc0[ROWS], acc1[ROWS];  // columns 0..15 and 16..31 of each row
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 b0, b1;
    load_line(panel, kk, b0, b1);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + kk]);
      acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, mask_lo, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, mask_hi, acc1[r]);
  }
}

// Store mask of the first n of 16 columns.
__mmask16 mask_of(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1); }

// The switch in packed_bf16_panel_avx512 names every tile height.
static_assert(L::kMaxTileRows == 14, "update the tile switch");

template <typename W>
void panel_avx512(const float* a, int64_t lda, int64_t rows, const W* panel, int64_t k, float* c, int64_t ldc,
                  int64_t cols) {
  const __mmask16 mask_lo = mask_of(cols), mask_hi = mask_of(cols - 16);
  // Split the rows into the fewest tiles, as even as possible (16 rows: 8 + 8,
  // not 14 + 2), so every tile keeps many accumulators busy.
  const int64_t tiles = (rows + L::kMaxTileRows - 1) / L::kMaxTileRows;
  int64_t r0 = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = rows / tiles + (t < rows % tiles ? 1 : 0);
    const float* at = a + r0 * lda;
    float* ct = c + r0 * ldc;
    switch (n) {
      case 1: tile<1, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 2: tile<2, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 3: tile<3, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 4: tile<4, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 5: tile<5, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 6: tile<6, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 7: tile<7, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 8: tile<8, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 9: tile<9, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 10: tile<10, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 11: tile<11, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 12: tile<12, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 13: tile<13, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
      case 14: tile<14, W>(at, lda, panel, k, ct, ldc, mask_lo, mask_hi); break;
    }
    r0 += n;
  }
}

}  // namespace

void packed_bf16_panel_avx512(const float* a, int64_t lda, int64_t rows, const uint16_t* panel, int64_t k,
                              float* c, int64_t ldc, int64_t cols) {
  panel_avx512(a, lda, rows, panel, k, c, ldc, cols);
}

void packed_f32_panel_avx512(const float* a, int64_t lda, int64_t rows, const float* panel, int64_t k, float* c,
                             int64_t ldc, int64_t cols) {
  panel_avx512(a, lda, rows, panel, k, c, ldc, cols);
}

}  // namespace moekit::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
