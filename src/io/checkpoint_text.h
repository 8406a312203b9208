// Small text helpers the checkpoint readers share: shapes and name lists in
// error messages, and which model layer a tensor name belongs to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit::io {

// "[2, 64, 32]"
inline std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The first `most` names joined by ", ", then how many there are in all.
inline std::string list_names(const std::vector<std::string>& names, size_t most = 24) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

// Whether a tensor name (or prefix) lies under "layers.<layer>.".
inline bool in_model_layer(const std::string& name, int layer) {
  return ("." + name).find(".layers." + std::to_string(layer) + ".") != std::string::npos;
}

}  // namespace moekit::io
