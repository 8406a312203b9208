// Text from files (names, header bytes) made safe for a one-line error
// message: bytes outside printable ASCII are written as \xNN, and long text
// is cut with "...".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace moekit {

std::string printable(std::string_view bytes, size_t max_bytes = 80);

}  // namespace moekit
