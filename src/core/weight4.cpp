#include "core/weight4.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "moekit/dtype.h"

namespace moekit {
namespace {

constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The e2m1 code nearest to x (ties to the even code; beyond 6 saturates).
uint8_t f32_to_e2m1(float x) {
  const float a = std::fabs(x);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const float d = std::fabs(a - kE2M1[c]), db = std::fabs(a - kE2M1[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) && best != 0 ? 8 : 0));
}

// "[i, j, k]" of flat index `flat` in `t`'s shape.
std::string index_text(const TensorView& t, int64_t flat) {
  std::string out;
  for (int d = t.rank - 1; d >= 0; --d) {
    const int64_t dim = t.shape[d] > 0 ? t.shape[d] : 1;
    out = std::to_string(flat % dim) + (out.empty() ? "" : ", ") + out;
    flat /= dim;
  }
  return "[" + out + "]";
}

std::string number_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

}  // namespace

float e2m1_to_f32(uint8_t nibble) { return kE2M1[nibble & 0x0F]; }

float e8m0_to_f32(uint8_t code) { return code == kE8M0Nan ? std::nanf("") : std::ldexp(1.0f, code - 127); }

DType weight4_scale_dtype(QuantMethod method) { return method == QuantMethod::kMxfp4 ? DType::kU8 : DType::kF32; }

void dequantize_weight4(QuantMethod method, const uint8_t* packed, const void* scales, int64_t rows, int64_t cols,
                        float* out) {
  const int64_t g = weight4_group(method), groups = cols / g;
  const bool mx = method == QuantMethod::kMxfp4;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < groups; ++b) {
      const int64_t s = r * groups + b;
      const float scale = mx ? e8m0_to_f32(static_cast<const uint8_t*>(scales)[s]) : static_cast<const float*>(scales)[s];
      const uint8_t* src = packed + (r * cols + b * g) / 2;
      float* dst = out + r * cols + b * g;
      for (int64_t j = 0; j < g / 2; ++j) {
        const uint8_t lo = src[j] & 0x0F, hi = src[j] >> 4;
        dst[2 * j] = (mx ? kE2M1[lo] : static_cast<float>(lo) - 8.0f) * scale;
        dst[2 * j + 1] = (mx ? kE2M1[hi] : static_cast<float>(hi) - 8.0f) * scale;
      }
    }
  }
}

void quantize_weight4(QuantMethod method, const float* w, int64_t rows, int64_t cols, uint8_t* packed, void* scales) {
  const int64_t g = weight4_group(method), groups = cols / g;
  const bool mx = method == QuantMethod::kMxfp4;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < groups; ++b) {
      const float* src = w + r * cols + b * g;
      float amax = 0.0f;
      for (int64_t j = 0; j < g; ++j) amax = std::fmax(amax, std::fabs(src[j]));
      float inv = 1.0f, scale = 1.0f;  // mxfp4 multiplies by 2^-e (exact); int4 divides by its scale
      if (mx) {
        // OCP MX: shared exponent floor(log2(amax)) - emax(e2m1) = ... - 2, within E8M0's [-127, 127].
        int e = amax > 0.0f ? std::ilogb(amax) - 2 : 0;
        e = e < -127 ? -127 : (e > 127 ? 127 : e);
        static_cast<uint8_t*>(scales)[r * groups + b] = static_cast<uint8_t>(e + 127);
        inv = std::ldexp(1.0f, -e);
      } else {
        scale = amax > 0.0f ? round_to_bf16(amax / kInt4Max) : 1.0f;
        if (!(scale > 0.0f)) scale = 1.0f;  // amax / 7 below bf16's range: the group rounds to 0
        static_cast<float*>(scales)[r * groups + b] = scale;
      }
      uint8_t* dst = packed + (r * cols + b * g) / 2;
      for (int64_t j = 0; j < g; j += 2) {
        uint8_t q[2];
        for (int i = 0; i < 2; ++i) {
          const float x = mx ? src[j + i] * inv : src[j + i] / scale;
          if (mx) {
            q[i] = f32_to_e2m1(x);
          } else {
            const float n = std::nearbyint(x);
            q[i] = static_cast<uint8_t>(static_cast<int>(n < -8.0f ? -8.0f : (n > 7.0f ? 7.0f : n)) + 8);
          }
        }
        dst[j / 2] = static_cast<uint8_t>(q[0] | (q[1] << 4));
      }
    }
  }
}

Status check_weight4_scale_values(QuantMethod method, const TensorView& scales, const std::string& name) {
  const int64_t n = scales.numel();
  if (method == QuantMethod::kMxfp4) {
    const uint8_t* p = scales.ptr<const uint8_t>();
    for (int64_t i = 0; i < n; ++i) {
      if (p[i] == kE8M0Nan) {
        return InvalidArgument(name + ": element " + std::to_string(i) + " is 255, the E8M0 code of NaN");
      }
    }
    return Status::Ok();
  }
  const float* p = scales.ptr<const float>();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i]) || !(p[i] > 0.0f)) {
      return InvalidArgument(name + ": element " + std::to_string(i) + " is " + std::to_string(p[i]) +
                             "; int4 scales must be finite and > 0");
    }
  }
  return Status::Ok();
}

Status check_weight4_range(QuantMethod method, const TensorView& packed, const TensorView& scales,
                           const std::string& packed_name, const std::string& scale_name) {
  const bool mx = method == QuantMethod::kMxfp4;
  const int64_t bytes = weight4_group(method) / 2, groups = scales.numel();
  const float largest = mx ? kE2M1Max : 8.0f;  // the largest |value| of a nibble (int4: -8)
  const uint8_t* w = packed.ptr<const uint8_t>();
  for (int64_t s = 0; s < groups; ++s) {
    const float scale = mx ? e8m0_to_f32(scales.ptr<const uint8_t>()[s]) : scales.ptr<const float>()[s];
    if (std::isnan(scale) || std::isfinite(largest * scale)) continue;  // NaN scales: check_weight4_scale_values
    for (int64_t j = 0; j < 2 * bytes; ++j) {
      const uint8_t nibble = static_cast<uint8_t>((w[s * bytes + j / 2] >> (4 * (j % 2))) & 0x0F);
      const float v = mx ? kE2M1[nibble] : static_cast<float>(nibble) - 8.0f;
      if (std::isfinite(v * scale)) continue;
      const std::string scale_text =
          mx ? "2^" + std::to_string(static_cast<int>(scales.ptr<const uint8_t>()[s]) - 127) : number_text(scale);
      return InvalidArgument(packed_name + ": a value " + number_text(v) + " times its scale " + scale_name +
                             index_text(scales, s) + " = " + scale_text +
                             " leaves f32's range; weights must be finite");
    }
  }
  return Status::Ok();
}

}  // namespace moekit
