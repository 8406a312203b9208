#include "alloc_report.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace moekit::tools {
namespace {
std::atomic<size_t> g_failed{0};
}  // namespace

size_t last_failed_allocation_bytes() { return g_failed.load(); }

void note_failed_allocation(size_t bytes) { g_failed.store(bytes); }

}  // namespace moekit::tools

// The replaceable global allocation functions, as the standard library's own
// (malloc / aligned_alloc, the new handler, then std::bad_alloc) plus the
// record of the size. Their memory is released with free(), so the matching
// operator delete is replaced too.
// NOTE: not under AddressSanitizer, whose runtime replaces these itself.
#if !defined(__SANITIZE_ADDRESS__)
namespace {

void* allocate(std::size_t n, std::size_t align) {
  if (n == 0) n = 1;
  for (;;) {
    void* p = nullptr;
    if (align <= alignof(std::max_align_t)) {
      p = std::malloc(n);
    } else if (n <= SIZE_MAX - align) {
      p = std::aligned_alloc(align, (n + align - 1) / align * align);  // a multiple of the alignment
    }
    if (p != nullptr) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) {
      moekit::tools::note_failed_allocation(n);
      throw std::bad_alloc();
    }
    handler();
  }
}

constexpr std::size_t kPlain = alignof(std::max_align_t);

}  // namespace

void* operator new(std::size_t n) { return allocate(n, kPlain); }
void* operator new[](std::size_t n) { return allocate(n, kPlain); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, kPlain);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, kPlain);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, static_cast<std::size_t>(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#endif
