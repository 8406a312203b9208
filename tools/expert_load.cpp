#include "expert_load.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace moekit::tools {

std::string load_bar(const std::vector<int64_t>& tokens) {
  static const char kLevels[] = " .:-=+*#%@";
  const size_t E = tokens.size();
  const size_t cols = std::min<size_t>(E, 64);
  std::vector<double> v(cols, 0.0);
  for (size_t e = 0; e < E; ++e) v[e * cols / E] += static_cast<double>(tokens[e]);
  const double top = v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  std::string s;
  for (double x : v) s += kLevels[top > 0 ? static_cast<int>(x / top * 9.0 + 0.5) : 0];
  return s;
}

void print_load(const std::vector<std::vector<int64_t>>& per_layer, const std::vector<std::string>& layer_names) {
  if (per_layer.empty() || per_layer[0].empty()) return;
  std::printf("expert load per layer (token-slots per expert; bar: share of the busiest, one column per %s)\n",
              per_layer[0].size() > 64 ? "group of experts" : "expert");
  for (size_t l = 0; l < per_layer.size(); ++l) {
    const auto& t = per_layer[l];
    const auto [mn, mx] = std::minmax_element(t.begin(), t.end());
    double sum = 0;
    for (int64_t x : t) sum += static_cast<double>(x);
    const double mean = sum / static_cast<double>(t.size());
    const std::string name = l < layer_names.size() ? layer_names[l] : "layer " + std::to_string(l);
    std::printf("  %s: min %5" PRId64 "  max %5" PRId64 "  mean %7.1f  max/mean %4.2f  |%s|\n", name.c_str(), *mn,
                *mx, mean, mean > 0 ? static_cast<double>(*mx) / mean : 0.0, load_bar(t).c_str());
  }
}

}  // namespace moekit::tools
