#include "shape_file.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace moekit::bench {

LayerShape load_layer_shape(const std::string& path, const std::string& name) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("shapes")) {
    for (const auto& e : j["shapes"]) {
      if (e.value("name", "") != name) continue;
      LayerShape s;
      s.name = name;
      s.E = e.value("experts", int64_t{0});
      s.k = e.value("top_k", int64_t{0});
      s.H = e.value("hidden", int64_t{0});
      s.I = e.value("intermediate", int64_t{0});
      if (s.E > 0 && s.k > 0 && s.H > 0 && s.I > 0) return s;
      std::fprintf(stderr, "shape %s in %s lacks experts, top_k, hidden or intermediate\n", name.c_str(),
                   path.c_str());
      std::exit(2);
    }
  }
  std::fprintf(stderr, "shape %s not found in %s\n", name.c_str(), path.c_str());
  std::exit(2);
}

}  // namespace moekit::bench
