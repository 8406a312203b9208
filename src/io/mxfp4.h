// MXFP4 (OCP microscaling) expert weights as gpt-oss ships them: e2m1 values
// packed two per byte (low nibble first), one E8M0 exponent (bias 127) per 32
// consecutive input columns. blocks [..., rows, K/32, 16] u8 and scales
// [..., rows, K/32] u8 -> [..., rows, K] bf16, exactly (an e2m1 value times a
// power of two has at most 2 significant bits).
#pragma once

#include <string>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::io {

inline constexpr int64_t kMxfp4Block = 32;  // columns per shared exponent

// Errors name `name`: shapes that disagree, a scale code 255 (E8M0 NaN), a
// value outside bf16's range.
StatusOr<HostTensor> dequantize_mxfp4(const HostTensor& blocks, const HostTensor& scales, const std::string& name);

}  // namespace moekit::io
