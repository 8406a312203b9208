// The MoE layer shapes of bench/shapes/moe_layers.json as the CPU benchmarks
// read them (E, k, H, I of one named shape).
#pragma once

#include <cstdint>
#include <string>

namespace moekit::bench {

struct LayerShape {
  std::string name;
  int64_t E = 0, k = 0, H = 0, I = 0;  // experts, top-k, hidden, intermediate
};

// The shape called `name` in the shape file at `path`. A benchmark cannot run
// without it: an unreadable file or an unknown name prints why and exits 2.
LayerShape load_layer_shape(const std::string& path, const std::string& name);

}  // namespace moekit::bench
