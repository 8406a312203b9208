// load_layer_file (include/moekit/checkpoint.h): a layer file's one MoE block,
// found by its names, read by the reader model folders use (io/layer_reader.h).
#include "io/checkpoint_text.h"
#include "io/layer_reader.h"
#include "io/tensor_files.h"
#include "moekit/checkpoint.h"

namespace moekit {

StatusOr<CheckpointLayer> load_layer_file(io::SafetensorsFile file, std::optional<int> layer,
                                          const std::function<Status(const CheckpointLayerSize&)>& check_size) {
  io::TensorFiles files = io::TensorFiles::of_file(std::move(file));
  MOEKIT_ASSIGN_OR_RETURN(const std::vector<std::string> all, io::moe_block_prefixes(files));
  std::vector<std::string> prefixes;
  for (const std::string& p : all) {
    if (!layer || io::in_model_layer(p, *layer)) prefixes.push_back(p);
  }
  if (prefixes.empty()) {
    // Name what is there: the tensors under the layer's prefix (or the file's), not a missing prefix.
    std::vector<std::string> there;
    for (const auto& [name, shard] : files.names()) {
      if (!layer || io::in_model_layer(name, *layer)) there.push_back(name);
    }
    std::string where = layer ? " for layer " + std::to_string(*layer) : std::string();
    if (layer && there.empty()) where += " (no tensor under 'layers." + std::to_string(*layer) + ".')";
    const std::string found = io::list_names(there, 12);
    return NotFound(files.where() + ": no MoE layer weights" + where +
                    "; expected w13/w2, experts.<e>.{gate_proj,up_proj,down_proj}.weight or experts.<e>.{w1,w2,w3}.weight" +
                    (found.empty() ? std::string() : "; found " + std::to_string(there.size()) + " tensors: " + found));
  }
  if (prefixes.size() > 1) {
    std::string list;
    for (size_t i = 0; i < prefixes.size() && i < 4; ++i) list += (i ? ", " : "") + ("'" + prefixes[i] + "'");
    return InvalidArgument(files.where() + ": " + std::to_string(prefixes.size()) + " MoE layers (" + list +
                           (prefixes.size() > 4 ? ", ..." : "") + "); pick one with --layer N");
  }
  CheckpointLayer out;
  out.layer = layer.value_or(0);
  MOEKIT_RETURN_IF_ERROR(io::read_moe_block(files, nullptr, prefixes[0], check_size, &out));
  out.files = files.files_used();
  return out;
}

}  // namespace moekit
