// parse_expert_tensor_name and stacked_w13_prefix (include/moekit/checkpoint.h):
// parsed by hand from the end of the name, in time linear in its length (a
// regular expression over a 100 MiB header's names could recurse deep enough
// to overflow the stack).
#include <charconv>

#include "moekit/checkpoint.h"

namespace moekit {
namespace {

constexpr std::string_view kWeight = ".weight";
constexpr std::string_view kExperts = "experts.";

struct ProjectionName {
  std::string_view name;
  Projection projection;
  bool mixtral;
};
constexpr ProjectionName kProjections[] = {
    {"gate_proj", Projection::kGate, false}, {"up_proj", Projection::kUp, false},
    {"down_proj", Projection::kDown, false}, {"w1", Projection::kGate, true},
    {"w3", Projection::kUp, true},           {"w2", Projection::kDown, true},
};

std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() > 40 ? out + "..." : out;
}

}  // namespace

StatusOr<std::optional<ExpertTensorName>> parse_expert_tensor_name(std::string_view name) {
  using Result = std::optional<ExpertTensorName>;
  if (!name.ends_with(kWeight)) return Result();
  std::string_view rest = name.substr(0, name.size() - kWeight.size());  // <prefix>experts.<e>.<proj>
  const size_t proj_dot = rest.rfind('.');
  if (proj_dot == std::string_view::npos) return Result();
  const std::string_view proj = rest.substr(proj_dot + 1);
  const ProjectionName* p = nullptr;
  for (const ProjectionName& candidate : kProjections) {
    if (proj == candidate.name) p = &candidate;
  }
  if (p == nullptr) return Result();
  rest = rest.substr(0, proj_dot);  // <prefix>experts.<e>
  const size_t index_dot = rest.rfind('.');
  if (index_dot == std::string_view::npos) return Result();
  const std::string_view digits = rest.substr(index_dot + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) return Result();
  const std::string_view head = rest.substr(0, index_dot + 1);  // <prefix>experts.
  if (!head.ends_with(kExperts)) return Result();
  int64_t expert = 0;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), expert);
  if (err != std::errc() || end != digits.data() + digits.size() || expert > kMaxExpertIndex ||
      (digits.size() > 1 && digits[0] == '0')) {
    return InvalidArgument("tensor '" + shown(name) + "': expert index '" + shown(digits) +
                           "' is not a number in [0, " + std::to_string(kMaxExpertIndex) +
                           "] written without leading zeros");
  }
  return Result(ExpertTensorName{std::string(head.substr(0, head.size() - kExperts.size())), expert, p->mixtral,
                                 p->projection});
}

std::optional<std::string> stacked_w13_prefix(std::string_view name) {
  if (!name.ends_with("w13")) return std::nullopt;
  return std::string(name.substr(0, name.size() - 3));
}

}  // namespace moekit
