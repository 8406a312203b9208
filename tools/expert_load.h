// Expert load per MoE layer, as `moekit run` and `moekit capture stats` print it:
// min, max, mean and a bar of each expert's share of the busiest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit::tools {

// " .:-=+*#%@" by share of the busiest expert; at most 64 columns (experts
// averaged in equal buckets when E > 64).
std::string load_bar(const std::vector<int64_t>& tokens);

// One line per layer; `per_layer[l][e]`: token-slots layer l routed to expert e.
// `layer_names[l]` labels the line (e.g. "layer 3"); empty: "layer <l>".
void print_load(const std::vector<std::vector<int64_t>>& per_layer, const std::vector<std::string>& layer_names = {});

}  // namespace moekit::tools
