// The CPU backend's emulation of the fp8 W8A8 schemes (docs/fp8.md): every
// quantized operand is rounded to e4m3fn exactly as the scheme specifies and
// then carried as the fp32 value it stands for, so the GEMMs stay the fp32
// sgemm path with fp32 accumulation. This file is the readable truth of the
// rounding the GPU kernels must reproduce.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/dtype.h"

namespace moekit::cpu {

// The activation scale of a group (or tensor) whose largest |x| is `amax`:
// max(amax, kFp8ScaleFloor) / 448, in fp32. Never 0, so x / scale is finite.
inline float fp8_act_scale(float amax) { return (amax > kFp8ScaleFloor ? amax : kFp8ScaleFloor) / kFp8E4M3Max; }

// x through e4m3 at `scale`: q = e4m3(x / scale) (fp32 quotient, round to
// nearest even, saturating at +-448), returned as the fp32 product q * scale.
inline float fp8_fake_quant(float x, float scale) {
  return f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(x / scale)) * scale;
}

// In place over `rows` rows of `cols` values (row stride `ld`): each row's
// 128-column groups (the last one possibly partial) quantized with their own
// scale, fp8_act_scale(amax of the group). fp8_block128 activations.
void fp8_fake_quant_groups(float* a, int64_t rows, int64_t cols, int64_t ld);

// Largest |value| over `rows` x `cols` (row stride `ld`); 0 when empty.
float fp8_amax(const float* a, int64_t rows, int64_t cols, int64_t ld);

// In place: every value quantized with the one `scale`. fp8_per_tensor activations.
void fp8_fake_quant_scaled(float* a, int64_t rows, int64_t cols, int64_t ld, float scale);

// The real value of fp8 expert weights: out[e, n, k] = e4m3(w[e, n, k]) * scale
// of its block (fp8_block128) or part (fp8_per_tensor), rounded to fp32.
// w: [E, N, K] e4m3 bits; `parts`: how many row parts w has (2 for gated w13:
// gate rows [0, N/2), up rows [N/2, N); else 1); scale laid out as the
// MoeWeights comment in kernel.h says for `method`. out: [E, N, K] f32.
void dequantize_fp8_weights(QuantMethod method, const uint8_t* w, const float* scale, int64_t E, int64_t N,
                            int64_t K, int64_t parts, float* out);

}  // namespace moekit::cpu
