// The names of a kernel's instances (streaming variants, CUTLASS tiles): each
// enum lists all its values in one array and names each value in one function;
// these turn that pair into the list a message shows and the parse an override
// (KernelOptions) needs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace moekit::cuda {

// "a, b, c": every name, in the array's order.
template <typename T, size_t N>
std::string instance_names(const T (&all)[N], const char* (*name)(T)) {
  std::string out;
  for (T v : all) out += (out.empty() ? "" : ", ") + std::string(name(v));
  return out;
}

// The value called `text`, if any.
template <typename T, size_t N>
std::optional<T> parse_instance_name(const T (&all)[N], const char* (*name)(T), std::string_view text) {
  for (T v : all) {
    if (text == name(v)) return v;
  }
  return std::nullopt;
}

}  // namespace moekit::cuda
