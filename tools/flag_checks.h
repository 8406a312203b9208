// Checks of number flags, run on the text before CLI11 converts it, so an
// out-of-range value is refused with the flag's name and its bounds instead of
// overflowing (a float of 1e39 is +inf; a negative --layer meant "none").
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace moekit::tools {

// A finite number > 0 that f32 can hold (--scaling).
CLI::Validator finite_positive_f32();

// An integer in [lo, hi] (--layer >= 0, --threads <= 1024).
CLI::Validator integer_in(int64_t lo, int64_t hi);

// An integer in [0, 2^64) (--seed): "-1" would otherwise wrap to 2^64 - 1.
CLI::Validator unsigned_64();

}  // namespace moekit::tools
