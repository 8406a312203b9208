// Fuzz target: the .npy reader (io::parse_npy). Anything it accepts must
// write back and read again to the same dtype, shape and bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moekit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  StatusOr<HostTensor> t = io::parse_npy(data, size, "fuzz.npy");
  if (!t.ok()) return 0;
  // Raw bf16 so the round trip is exact for every dtype the reader yields.
  StatusOr<std::vector<uint8_t>> bytes = io::encode_npy(t->view(), {io::Bf16Storage::kRaw});
  if (!bytes.ok()) __builtin_trap();
  StatusOr<HostTensor> back = io::parse_npy(bytes->data(), bytes->size(), "round-trip.npy");
  if (!back.ok() || back->dtype() != t->dtype() || back->shape() != t->shape() || back->nbytes() != t->nbytes()) {
    __builtin_trap();
  }
  if (t->nbytes() && std::memcmp(back->data<uint8_t>(), t->data<uint8_t>(), t->nbytes()) != 0) __builtin_trap();
  return 0;
}
