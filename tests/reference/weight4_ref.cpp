// fp64 decoder of the 4-bit weight formats. e2m1 is decoded from its fields
// by the format's definition (no table), E8M0 by pow(2, code - 127), so it
// shares no method with the backends' lookup tables.
#include <cmath>
#include <stdexcept>

#include "reference.h"

namespace moekit_ref {
namespace {

double e2m1_value(unsigned nibble) {
  const int sign = (nibble >> 3) & 1, exponent = (nibble >> 1) & 3, mantissa = nibble & 1;
  const double magnitude = exponent == 0 ? 0.5 * mantissa  // subnormal: 2^(1 - bias) * m/2
                                         : std::pow(2.0, exponent - 1) * (1.0 + 0.5 * mantissa);
  return sign ? -magnitude : magnitude;
}

}  // namespace

std::vector<double> weight4_values(const std::string& scheme, const std::vector<uint8_t>& packed,
                                   const std::vector<double>& scales, int64_t rows, int64_t cols, int64_t group) {
  const bool mx = scheme == "mxfp4";
  if (!mx && scheme != "int4") throw std::invalid_argument("weight4_values: unknown scheme " + scheme);
  if (cols % group != 0 || static_cast<int64_t>(packed.size()) != rows * cols / 2 ||
      static_cast<int64_t>(scales.size()) != rows * (cols / group)) {
    throw std::invalid_argument("weight4_values: sizes disagree");
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = packed[static_cast<size_t>((r * cols + c) / 2)];
      const unsigned nibble = c % 2 == 0 ? byte % 16 : byte / 16;
      const double s = scales[static_cast<size_t>(r * (cols / group) + c / group)];
      double scale = s;
      if (mx) {
        if (s == 255.0) throw std::invalid_argument("weight4_values: E8M0 code 255 (NaN)");
        scale = std::pow(2.0, s - 127.0);
      }
      const double v = mx ? e2m1_value(nibble) : static_cast<double>(static_cast<int>(nibble) - 8);
      out[static_cast<size_t>(r * cols + c)] = v * scale;
    }
  }
  return out;
}

}  // namespace moekit_ref
