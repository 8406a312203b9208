#include "core/checked_size.h"

namespace moekit {

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t p = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p)) return std::nullopt;
  return p;
}

std::optional<int64_t> checked_nbytes(std::span<const int64_t> shape, int64_t element_bytes) {
  int64_t span = element_bytes;  // bytes spanned by the non-zero dimensions
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
      continue;
    }
    const std::optional<int64_t> p = checked_mul(span, d);
    if (!p) return std::nullopt;
    span = *p;
  }
  return empty ? 0 : span;
}

}  // namespace moekit
