// safetensors dtype names and the header layout (docs/io.md): an 8-byte
// little-endian header length N, N bytes of JSON, then the data section.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "moekit/dtype.h"

namespace moekit::io::safetensors {

inline constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit (100 MiB)
inline constexpr uint64_t kHeaderAlign = 8;              // writers pad the JSON with spaces to this

struct DtypeInfo {
  std::optional<DType> dtype;  // empty: valid in safetensors, not loaded by moekit
  uint64_t element_bytes = 0;
};
// Every dtype name the format defines; nullopt for an unknown name.
std::optional<DtypeInfo> dtype_info(std::string_view name);
const char* dtype_to_name(DType dtype);

}  // namespace moekit::io::safetensors
