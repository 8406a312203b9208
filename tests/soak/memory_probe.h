// What the process holds, for the soak tests: bytes the allocator has handed
// out and not taken back (glibc's count, or the sanitizer allocator's under
// AddressSanitizer) and the resident set.
#pragma once

#include <cstddef>

namespace moekit::testing {

size_t heap_bytes_in_use();
size_t resident_bytes();
// True under AddressSanitizer, whose quarantine keeps freed memory resident.
bool resident_set_is_meaningful();

}  // namespace moekit::testing
