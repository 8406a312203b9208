// Size arithmetic on shapes that come from files and flags. Every product is
// checked, so a hostile shape is refused by its reader instead of overflowing
// later (a stride, numel() or nbytes() of a view of it).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace moekit {

// a * b for a, b >= 0, or nullopt when the product does not fit int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b);

// Bytes of a contiguous tensor of `shape`, or nullopt when a dimension is
// negative or the product of the non-zero dimensions times element_bytes does
// not fit int64. NOTE: zeros are skipped on purpose: an empty tensor of shape
// (0, 2^42, 2^42) holds no bytes, but its strides would still overflow.
std::optional<int64_t> checked_nbytes(std::span<const int64_t> shape, int64_t element_bytes);

}  // namespace moekit
