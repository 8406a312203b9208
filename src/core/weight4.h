// The 4-bit weight formats (docs/weights_4bit.md): two values per byte, the
// low nibble first (column 2j low, 2j + 1 high), one scale per group of
// weight4_group(method) consecutive input columns of a row.
//   mxfp4:          e2m1 values (sign, 2 exponent bits, 1 mantissa bit), an
//                   E8M0 exponent per 32 columns (u8, value 2^(code - 127), 255 NaN);
//   int4_g32/_g128: nibble - 8 in [-8, 7], an f32 scale per 32/128 columns.
// The CPU backend dequantizes with these, the loaders check with them and
// `moekit quantize` writes with them; the fp64 reference has its own decoder.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/config.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

inline constexpr float kE2M1Max = 6.0f;   // largest e2m1 magnitude
inline constexpr float kInt4Max = 7.0f;   // symmetric int4: scale = amax / 7
inline constexpr uint8_t kE8M0Nan = 255;  // the E8M0 code of NaN

float e2m1_to_f32(uint8_t nibble);             // the low 4 bits
float e8m0_to_f32(uint8_t code);               // 2^(code - 127); 255 is NaN

// The dtype of a method's scales: u8 (E8M0) for mxfp4, f32 for int4.
DType weight4_scale_dtype(QuantMethod method);

// rows x cols values (cols a multiple of the group) from packed [rows, cols/2]
// bytes and scales [rows, cols/group] of weight4_scale_dtype(method), to f32,
// exactly (every value is a small integer or e2m1 value times a scale).
void dequantize_weight4(QuantMethod method, const uint8_t* packed, const void* scales, int64_t rows, int64_t cols,
                        float* out);

// The inverse for finite f32 rows: mxfp4 takes the OCP exponent
// floor(log2(amax)) - 2 per group and rounds each value to the nearest e2m1
// (ties to even, saturating at 6); int4 takes scale = amax / 7 rounded to bf16
// (so a checkpoint's bf16 scale holds it exactly) and rounds to the nearest
// integer in [-8, 7]. An all-zero group gets exponent 0 / scale 1.
void quantize_weight4(QuantMethod method, const float* w, int64_t rows, int64_t cols, uint8_t* packed, void* scales);

// The scale values a layer refuses, naming `name`: an E8M0 code 255 (NaN), an
// int4 scale that is not finite or not > 0.
Status check_weight4_scale_values(QuantMethod method, const TensorView& scales, const std::string& name);

// The weights a layer refuses although every scale passes the check above: a
// value times its group's scale that leaves f32's range (mxfp4: code 254 with
// |e2m1| >= 2, code 253 with |e2m1| >= 4; int4: a scale near FLT_MAX). Host
// views, packed [..., rows, cols/2] with scales [..., rows, cols/group]; the
// error names both tensors and the scale's index. Only groups whose largest
// possible weight overflows are scanned, so a good layer costs one pass over
// the scales.
Status check_weight4_range(QuantMethod method, const TensorView& packed, const TensorView& scales,
                           const std::string& packed_name, const std::string& scale_name);

}  // namespace moekit
