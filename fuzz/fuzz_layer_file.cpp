// Fuzz target: the layer-file reader of `moekit layer` (tools/layer_names.h,
// tools/layer_weights.h) over a parsed safetensors file. Every expert tensor
// name must parse back to itself, and a layer it loads must have the shapes
// docs/layer_files.md promises.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "layer_names.h"
#include "layer_weights.h"
#include "moekit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  using namespace moekit::tools;
  StatusOr<io::SafetensorsFile> f = io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  static const char* const kProjection[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
  for (const io::SafetensorsEntry& e : f->entries()) {
    StatusOr<std::optional<ExpertTensorName>> name = parse_expert_tensor_name(e.name);
    if (!name.ok() || !name->has_value()) continue;
    const ExpertTensorName& n = **name;
    const std::string again = n.prefix + "experts." + std::to_string(n.expert) + "." +
                              kProjection[n.mixtral][static_cast<int>(n.projection)] + ".weight";
    if (again != e.name || n.expert < 0 || n.expert > kMaxExpertIndex) __builtin_trap();
  }
  for (const std::optional<int> layer : {std::optional<int>(), std::optional<int>(static_cast<int>(size % 4))}) {
    StatusOr<LayerCheckpoint> c = load_layer_checkpoint(*f, layer);
    if (!c.ok()) continue;
    const auto& w13 = c->w13.shape();
    const auto& w2 = c->w2.shape();
    if (w13.size() != 3 || w2.size() != 3 || w13[0] != w2[0] || w13[2] != w2[1] || c->w13.dtype() != c->w2.dtype()) {
      __builtin_trap();
    }
  }
  return 0;
}
