#include "moekit/dtype.h"

#include <cmath>

namespace moekit {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "f8_e4m3";
    case DType::kI32: return "i32";
    case DType::kI16: return "i16";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI16,
                  DType::kU8}) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {                        // below the smallest normal 2^-14
    // Subnormal: value = m * 2^-24; round |f| * 2^24 to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact (power of two)
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias exponent (127 -> 15), round 23 -> 10 mantissa bits to nearest even.
  uint32_t r = abs - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -24);
    return sign ? -out : out;
  }
  uint32_t u;
  if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  std::memcpy(&out, &u, 4);
  return out;
}

uint8_t f32_to_f8e4m3_bits(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  // Smallest normal is 2^-6; subnormals are m * 2^-9 (m = 1..7).
  if (a < 0.015625f) {
    const float m = std::nearbyint(a * 512.0f);  // ties to even under the default mode
    return sign | static_cast<uint8_t>(m);       // m == 8 lands exactly on the smallest normal
  }
  int e;
  const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  // mantissa with 3 fraction bits: a = (1 + m/8) * 2^(e-1)
  float m = std::nearbyint((frac * 2.0f - 1.0f) * 8.0f);
  int exp = e - 1;
  if (m >= 8.0f) {
    m = 0.0f;
    ++exp;
  }
  const int biased = exp + 7;
  if (biased > 15 || (biased == 15 && m > 6.0f)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | static_cast<int>(m));
}

float f8e4m3_bits_to_f32(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  if (exp == 15 && man == 7) return std::nanf("");
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                     : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return neg ? -v : v;
}

}  // namespace moekit
