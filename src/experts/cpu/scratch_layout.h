// Carves typed, 64-byte aligned buffers out of a caller-owned workspace. The
// same sequence of take() calls run on a null base measures the bytes needed,
// so workspace_size() and run() cannot disagree about the layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit::cpu {

class ScratchLayout {
 public:
  static constexpr size_t kAlign = 64;
  // base == nullptr: measure only (take() returns nullptr).
  explicit ScratchLayout(void* base) : base_(static_cast<unsigned char*>(base)) {}

  template <typename T>
  T* take(int64_t count) {
    const size_t at = used_;
    used_ = round_up(used_ + static_cast<size_t>(count) * sizeof(T));
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  // Bytes taken so far, plus slack for aligning an arbitrary base pointer.
  size_t bytes_needed() const { return used_ + kAlign; }
  // A base pointer rounded up to kAlign (the slack above pays for it).
  static void* aligned(void* p) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<void*>((u + kAlign - 1) & ~(uintptr_t{kAlign} - 1));
  }

 private:
  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  unsigned char* base_;
  size_t used_ = 0;
};

}  // namespace moekit::cpu
