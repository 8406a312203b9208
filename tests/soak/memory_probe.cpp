#include "soak/memory_probe.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOEKIT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MOEKIT_ASAN 1
#endif

#ifdef MOEKIT_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace moekit::testing {

size_t heap_bytes_in_use() {
#ifdef MOEKIT_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  return mallinfo2().uordblks;
#endif
}

size_t resident_bytes() {
  long pages = 0, resident = 0;
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

bool resident_set_is_meaningful() {
#ifdef MOEKIT_ASAN
  return false;
#else
  return true;
#endif
}

}  // namespace moekit::testing
