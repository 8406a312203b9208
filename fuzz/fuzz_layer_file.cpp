// Fuzz target: the layer-file reader of `moekit layer` (load_layer_file and
// parse_expert_tensor_name, include/moekit/checkpoint.h) over a parsed
// safetensors file. Every expert tensor
// name must parse back to itself, and a layer it loads must have the shapes
// docs/layer_files.md promises (4-bit ones: packed rows, scales per group).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "moekit/checkpoint.h"
#include "moekit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
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
    StatusOr<io::SafetensorsFile> again = io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
    StatusOr<CheckpointLayer> c = load_layer_file(std::move(*again), layer);
    if (!c.ok()) continue;
    const auto& w13 = c->w13.shape();
    const auto& w2 = c->w2.shape();
    const QuantScheme& q = c->config.quant;  // 4-bit rows hold two values a byte
    if (w13.size() != 3 || w2.size() != 3 || w13[0] != w2[0] || w13[2] != q.stored_cols(w2[1]) ||
        c->w13.dtype() != c->w2.dtype() || w13[0] != c->config.num_experts ||
        w2[2] != q.stored_cols(c->config.intermediate) || w13[2] != q.stored_cols(c->config.hidden) ||
        (q.is_weight4() && c->w2_scale.shape() != std::vector<int64_t>{w2[0], w2[1], c->config.intermediate /
                                                                                        weight4_group(q.method)})) {
      __builtin_trap();
    }
  }
  return 0;
}
