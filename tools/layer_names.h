// Tensor names of a layer file (docs/layer_files.md): which expert and which
// projection a name holds. Parsed by hand from the end of the name, in time
// linear in its length (a regular expression over a 100 MiB header's names
// could recurse deep enough to overflow the stack).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "moekit/status.h"

namespace moekit::tools {

enum class Projection : uint8_t { kGate, kUp, kDown };

// <prefix>experts.<expert>.<projection>.weight
struct ExpertTensorName {
  std::string prefix;  // everything before "experts."
  int64_t expert = 0;
  bool mixtral = false;  // w1/w3/w2, else gate_proj/up_proj/down_proj
  Projection projection = Projection::kGate;
};

// NOTE: expert ids are captured as int16, so E <= 32767 (RoutingConfig::validate).
inline constexpr int64_t kMaxExpertIndex = 32766;

// nullopt: not an expert tensor's name. An error: it is one, but its index is
// not a decimal number in [0, kMaxExpertIndex] without leading zeros (two
// spellings of one index would make two tensors claim one expert).
StatusOr<std::optional<ExpertTensorName>> parse_expert_tensor_name(std::string_view name);

// The prefix of a stacked "<prefix>w13" tensor's name, else nullopt.
std::optional<std::string> stacked_w13_prefix(std::string_view name);

}  // namespace moekit::tools
