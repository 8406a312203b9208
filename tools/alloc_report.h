// The size of the allocation that failed, for the command line's last-resort
// answer to std::bad_alloc ("an allocation of 12.3 GiB failed"): the binary
// replaces the global operator new (alloc_report.cpp), which records the size
// before it throws.
#pragma once

#include <cstddef>

namespace moekit::tools {

// Bytes of the most recent operator new that failed; 0 when none has.
size_t last_failed_allocation_bytes();
void note_failed_allocation(size_t bytes);

}  // namespace moekit::tools
