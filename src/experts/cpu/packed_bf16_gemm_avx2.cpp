#include "experts/cpu/packed_bf16_gemm_avx2.h"

#include "experts/cpu/packed_bf16_gemm_avx512.h"  // PackedBf16Layout: constants only

#include <immintrin.h>

// NOTE: as in packed_bf16_gemm_avx512.cpp, the instruction set is raised for
// the functions below only, and nothing with inline code is included after it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace moekit::cpu {
namespace {

using L = PackedBf16Layout;
constexpr int64_t kPrefetchLines = 32;  // as the AVX-512 kernel: the first tile streams the panel
constexpr int kMaxRows = 2;

// Columns [0, n) of the 8 in v to dst (n may be <= 0 or >= 8).
void store8(float* dst, __m256 v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(dst, v);
  } else if (n > 0) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(dst, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes), v);
  }
}

// Columns 0-7, 8-15, 16-23, 24-31 of panel line kk as fp32. A bf16 line's 16
// lanes load as two halves; each gives 8 columns from its high bf16 halves
// (AND) and 8 from its low halves (shift). An f32 line is four loads.
inline void load_line(const uint16_t* panel, int64_t kk, __m256 (&b)[4]) {
  const __m256i high_half = _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u));
  const uint16_t* line = panel + kk * L::kPanelCols;
  _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchLines * L::kPanelCols), _MM_HINT_T0);
  const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(line));       // lanes 0..7
  const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(line + 16));  // lanes 8..15
  b[0] = _mm256_castsi256_ps(_mm256_and_si256(lo, high_half));
  b[1] = _mm256_castsi256_ps(_mm256_and_si256(hi, high_half));
  b[2] = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
  b[3] = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
}
inline void load_line(const float* panel, int64_t kk, __m256 (&b)[4]) {
  const float* line = panel + kk * L::kPanelCols;
  _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchLines * L::kPanelCols), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchLines * L::kPanelCols + 16), _MM_HINT_T0);
  for (int q = 0; q < 4; ++q) b[q] = _mm256_load_ps(line + 8 * q);
}

// One register tile: ROWS rows x 32 columns, all of K.
template <int ROWS, typename W>
void tile(const float* a, int64_t lda, const W* panel, int64_t k, float* c, int64_t ldc, int64_t cols) {
  __m256 acc[ROWS][4];
  for (int r = 0; r < ROWS; ++r) {
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    __m256 b[4];
    load_line(panel, kk, b);
    for (int r = 0; r < ROWS; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * lda + kk);
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_fmadd_ps(ar, b[q], acc[r][q]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int q = 0; q < 4; ++q) store8(c + r * ldc + 8 * q, acc[r][q], cols - 8 * q);
  }
}

template <typename W>
void panel_avx2(const float* a, int64_t lda, int64_t rows, const W* panel, int64_t k, float* c, int64_t ldc,
                int64_t cols) {
  int64_t r = 0;
  for (; r + kMaxRows <= rows; r += kMaxRows) tile<kMaxRows>(a + r * lda, lda, panel, k, c + r * ldc, ldc, cols);
  if (r < rows) tile<1>(a + r * lda, lda, panel, k, c + r * ldc, ldc, cols);
}

static_assert(L::kPanelCols == 32, "a line is two halves of eight lanes");

}  // namespace

void packed_bf16_panel_avx2(const float* a, int64_t lda, int64_t rows, const uint16_t* panel, int64_t k, float* c,
                            int64_t ldc, int64_t cols) {
  panel_avx2(a, lda, rows, panel, k, c, ldc, cols);
}

void packed_f32_panel_avx2(const float* a, int64_t lda, int64_t rows, const float* panel, int64_t k, float* c,
                           int64_t ldc, int64_t cols) {
  panel_avx2(a, lda, rows, panel, k, c, ldc, cols);
}

}  // namespace moekit::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
