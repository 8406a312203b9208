// The .npy header: parsing the Python-literal dict NumPy writes, and writing
// it byte for byte the way numpy.save does (docs/io.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/io.h"
#include "moekit/status.h"

namespace moekit::io::npy {

inline constexpr char kMagic[] = "\x93NUMPY";
inline constexpr size_t kMagicLen = 6;
inline constexpr size_t kAlign = 64;  // data starts at a multiple of this (NumPy's ARRAY_ALIGN)

struct Header {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t header_bytes = 0;  // magic + version + length field + dict: where the data starts
  uint64_t data_bytes = 0;    // numel x element size
};

// Size of the fixed preamble (magic, version, header length) given the first
// 8 bytes of a file; the dict follows it. Fails on bad magic or version.
StatusOr<size_t> preamble_size(const uint8_t* first8, size_t available, std::string_view name);
// Parses preamble + dict (`bytes` holds at least header_bytes of the file).
StatusOr<Header> parse_header(const uint8_t* bytes, size_t size, std::string_view name);
// The full header (preamble + padded dict) for a tensor stored as `descr`.
std::vector<uint8_t> format_header(std::string_view descr, const std::vector<int64_t>& shape);

}  // namespace moekit::io::npy
