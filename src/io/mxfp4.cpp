#include "io/mxfp4.h"

#include <cmath>
#include <vector>

#include "io/checkpoint_text.h"
#include "moekit/dtype.h"

namespace moekit::io {
namespace {

// e2m1: sign, 2 exponent bits, 1 mantissa bit.
constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};


}  // namespace

StatusOr<HostTensor> dequantize_mxfp4(const HostTensor& blocks, const HostTensor& scales, const std::string& name) {
  const std::vector<int64_t>& b = blocks.shape();
  const std::vector<int64_t>& s = scales.shape();
  if (blocks.dtype() != DType::kU8 || scales.dtype() != DType::kU8) {
    return InvalidArgument(name + "_blocks/_scales: MXFP4 tensors are U8, got " + dtype_name(blocks.dtype()) + " and " +
                           dtype_name(scales.dtype()));
  }
  if (b.size() < 3 || b.back() != kMxfp4Block / 2 || s.size() != b.size() - 1 ||
      !std::equal(s.begin(), s.end(), b.begin())) {
    return InvalidArgument(name + "_blocks " + shape_text(b) + " / " + name + "_scales " + shape_text(s) +
                           ": expected [..., rows, K/32, 16] and [..., rows, K/32]");
  }
  std::vector<int64_t> out_shape(s.begin(), s.end());
  out_shape.back() *= kMxfp4Block;
  HostTensor out(DType::kBF16, out_shape);
  const uint8_t* packed = blocks.data<uint8_t>();
  const uint8_t* exps = scales.data<uint8_t>();
  uint16_t* dst = out.data<uint16_t>();
  const int64_t groups = scales.numel();
  for (int64_t g = 0; g < groups; ++g) {
    if (exps[g] == 255) {
      return InvalidArgument(name + "_scales: element " + std::to_string(g) + " is 255, the E8M0 code of NaN");
    }
    const float scale = std::ldexp(1.0f, static_cast<int>(exps[g]) - 127);
    for (int64_t j = 0; j < kMxfp4Block / 2; ++j) {
      const uint8_t byte = packed[g * (kMxfp4Block / 2) + j];
      const float lo = kE2M1[byte & 0x0F] * scale, hi = kE2M1[byte >> 4] * scale;
      if (!std::isfinite(lo) || !std::isfinite(hi)) {
        return InvalidArgument(name + "_scales: element " + std::to_string(g) + " (exponent " +
                               std::to_string(static_cast<int>(exps[g]) - 127) + ") takes a weight past bf16's range");
      }
      dst[g * kMxfp4Block + 2 * j] = f32_to_bf16_bits(lo);  // exact: at most 2 significant bits
      dst[g * kMxfp4Block + 2 * j + 1] = f32_to_bf16_bits(hi);
    }
  }
  return out;
}

}  // namespace moekit::io
