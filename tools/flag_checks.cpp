#include "flag_checks.h"

#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>

namespace moekit::tools {

CLI::Validator finite_positive_f32() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = !text.empty() && end == text.c_str() + text.size();
        if (!parsed || errno == ERANGE || !std::isfinite(v) || !(v > 0.0) || v > FLT_MAX) {
          return "must be a finite number > 0 that f32 can hold (at most 3.4e38), got '" + text + "'";
        }
        return {};
      },
      "NUMBER > 0", "finite_positive_f32");
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        const bool parsed = !text.empty() && end == text.c_str() + text.size();
        if (!parsed || errno == ERANGE || v < lo || v > hi) {
          return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + text + "'";
        }
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "integer_in");
}

CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        std::strtoull(text.c_str(), &end, 10);
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || end != text.c_str() + text.size() || errno == ERANGE) {
          return "must be an integer in [0, 2^64), got '" + text + "'";
        }
        return {};
      },
      "UINT64", "unsigned_64");
}

}  // namespace moekit::tools
