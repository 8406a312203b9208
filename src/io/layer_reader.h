// The one reader of an MoE block's tensors, for model folders and layer files
// alike (include/moekit/checkpoint.h): experts under every naming and scheme,
// biases, router, shared expert; every tensor under the block's prefix is
// either read or refused by name.
#pragma once

#include <functional>
#include <string>

#include "io/model_config.h"
#include "io/tensor_files.h"
#include "moekit/checkpoint.h"

namespace moekit::io {

// Reads the block under `prefix` into `out`. `model`: what a folder's
// config.json says (out->config already holds it), checked against the
// tensors; nullptr for a layer file, whose sizes come from the tensors.
// `check_size` is called once the tensors are found and checked, before
// anything is allocated for them. `keep_packed`: gpt-oss's MXFP4 experts as
// stored (CheckpointLoadOptions::keep_packed_weights), else dequantized to bf16.
Status read_moe_block(TensorFiles& files, const ModelMoeConfig* model, const std::string& prefix,
                      const std::function<Status(const CheckpointLayerSize&)>& check_size, CheckpointLayer* out,
                      bool keep_packed = false);

// The prefixes of the MoE blocks in `names`: what precedes "experts." in a
// per-expert or fused name, or "w13" in a stacked pair (<prefix>w13, <prefix>w2).
// An error when an expert name has a malformed index.
StatusOr<std::vector<std::string>> moe_block_prefixes(const TensorFiles& files);

}  // namespace moekit::io
