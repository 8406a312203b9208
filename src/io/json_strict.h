// JSON from files, parsed strictly: exactly one JSON value, no NUL byte (the
// JSON parser would stop there and ignore what follows), and no key twice in
// an object (the parser would keep the last one silently). Safetensors headers
// and capture metadata go through here, so a file means one thing only.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "moekit/status.h"

namespace moekit::io {

// `what` names the text in messages ("x.safetensors: header"). DataLoss on failure.
StatusOr<nlohmann::json> parse_json_strict(std::string_view text, const std::string& what);

// The value of an integer JSON number when it fits [lo, hi]; nullopt for a
// non-integer, or an integer outside the range (never a silent truncation).
std::optional<int64_t> json_integer(const nlohmann::json& j, int64_t lo, int64_t hi);

}  // namespace moekit::io
