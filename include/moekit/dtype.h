// Element types and exact host-side conversions (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moekit {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI32, kI16, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...
std::optional<DType> parse_dtype(std::string_view name);

// ---- bf16: the top 16 bits of an fp32, rounded to nearest even. NaN stays NaN.
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The fp32 value after a round trip through bf16.
inline float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// ---- f16 (IEEE binary16), round to nearest even, overflow to Inf.
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);

// ---- f8 e4m3 "fn" (no Inf; max finite 448; 0x7f/0xff are NaN). Round to nearest
// even; values beyond 448 saturate to +-448 (the convention of scaled fp8 GEMMs).
uint8_t f32_to_f8e4m3_bits(float f);
float f8e4m3_bits_to_f32(uint8_t b);

// Storage type for bf16 on the host: raw bits, no arithmetic.
struct BFloat16 {
  uint16_t bits;
};

}  // namespace moekit
