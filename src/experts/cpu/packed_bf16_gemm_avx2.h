// The AVX2 micro-kernel of the packed bf16 expert GEMM (packed_bf16_gemm.h),
// for CPUs without AVX-512: the same weight layout (PackedBf16Layout) and the
// same arithmetic (fp32 FMAs in ascending k per element, so its results equal
// the AVX-512 kernel's bit for bit), in 256-bit registers. Only
// packed_bf16_gemm_avx2.cpp is compiled for AVX2 + FMA; call it only when the
// CPU has both (packed_bf16_gemm.cpp checks).
//
// Plain declarations only (no inline code), as packed_bf16_gemm_avx512.h.
#pragma once

#include <cstdint>

namespace moekit::cpu {

// packed_bf16_panel_avx512's contract, in register tiles of at most two rows
// (four ymm accumulators a row, the four widened weight vectors and the
// broadcast input fit the 16 ymm registers).
void packed_bf16_panel_avx2(const float* a, int64_t lda, int64_t rows, const uint16_t* panel, int64_t k, float* c,
                            int64_t ldc, int64_t cols);
// The same for an f32 panel (packed_f32_panel_avx512's layout).
void packed_f32_panel_avx2(const float* a, int64_t lda, int64_t rows, const float* panel, int64_t k, float* c,
                           int64_t ldc, int64_t cols);

}  // namespace moekit::cpu
