// Fuzz target: the safetensors reader (io::SafetensorsFile::parse). Every
// tensor of a file it accepts must be readable (or refused with a Status),
// and the loadable ones must write back and read again byte for byte.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  StatusOr<io::SafetensorsFile> f = io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  std::vector<HostTensor> kept;  // the loadable tensors, in entry order
  std::vector<std::string> names;
  for (const io::SafetensorsEntry& e : f->entries()) {
    if (f->find(e.name) != &e) __builtin_trap();  // names are unique and found
    (void)f->view(e.name);
    StatusOr<HostTensor> t = f->read(e.name);
    const bool loadable = e.dtype.has_value() && e.shape.size() <= static_cast<size_t>(kMaxRank);
    if (t.ok() != loadable) __builtin_trap();
    if (!t.ok()) continue;
    if (t->nbytes() != e.nbytes) __builtin_trap();
    kept.push_back(std::move(t).value());
    names.push_back(e.name);
  }
  std::vector<io::NamedTensor> named;
  for (size_t i = 0; i < kept.size(); ++i) named.push_back({names[i], kept[i].view()});
  StatusOr<std::vector<uint8_t>> bytes = io::encode_safetensors(named, f->metadata());
  if (!bytes.ok()) __builtin_trap();
  StatusOr<io::SafetensorsFile> back = io::SafetensorsFile::parse(bytes->data(), bytes->size(), "round-trip");
  if (!back.ok() || back->entries().size() != named.size() || back->metadata() != f->metadata()) __builtin_trap();
  for (const io::NamedTensor& n : named) {
    StatusOr<HostTensor> t = back->read(n.name);
    if (!t.ok() || t->nbytes() != n.tensor.nbytes()) __builtin_trap();
    if (t->nbytes() && std::memcmp(t->data<uint8_t>(), n.tensor.data, t->nbytes()) != 0) __builtin_trap();
  }
  return 0;
}
