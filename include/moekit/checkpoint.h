// One MoE layer of a model folder, as the `transformers` library's
// save_pretrained writes it (config.json and safetensors shards, with
// model.safetensors.index.json when sharded): the MoeConfig built from the
// config's own fields and the layer's weights, found under every naming in use.
// The shards are memory-mapped; only the layer's tensors are read.
// Families, namings and fields read: docs/layer_files.md.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

struct CheckpointLayer {
  // From config.json; max_num_tokens is 1 (the caller sets it), backend "auto".
  MoeConfig config;
  std::string model_type;  // config.json "model_type"
  int layer = 0;           // the model layer index
  int num_layers = 0;      // num_hidden_layers
  std::string prefix;      // the layer's MoE block, e.g. "model.layers.3.mlp."
  std::string naming;      // how its experts are stored, e.g. "experts.<e>.{gate,up,down}_proj"
  std::vector<std::string> files;  // the shards its tensors came from

  HostTensor w13;            // [E, n1, H] checkpoint dtype, moekit's row layout (kernel.h)
  HostTensor w2;             // [E, H, I]
  HostTensor w13_bias;       // [E, n1] f32, or empty (shape {})
  HostTensor w2_bias;        // [E, H] f32, or empty
  HostTensor score_bias;     // [E] f32 e_score_correction_bias, or empty
  HostTensor router_weight;  // [E, H] f32, or empty
  HostTensor router_bias;    // [E] f32, or empty
  HostTensor shared_w13;     // [2 Is, H] checkpoint dtype, or empty
  HostTensor shared_w2;      // [H, Is]
  HostTensor shared_gate;    // [H] f32, or empty

  // Views of the tensors above, as MoeLayer::create takes them.
  MoeWeights weights() const;
  // What was found, one line per item, for people.
  std::string summary() const;
};

// Reads `model_dir`/config.json and the tensors of model layer `layer`. Errors
// name the real problem: no config, a layer past the last, a dense layer, a
// family moekit does not run, a missing or misshapen tensor (by name), or a
// naming not recognised (listing the names found under the layer's prefix).
StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer);

// What the layer will take, known from config.json and the shards' headers
// before any tensor is read.
struct CheckpointLayerSize {
  MoeConfig config;           // from config.json (dtypes not yet set)
  DType dtype = DType::kBF16; // the expert weights' dtype in the shards
  int64_t w13_rows = 0;       // n1 of w13 [E, n1, H]
  uint64_t tensor_bytes = 0;  // the bytes of every tensor under the layer's MoE prefix
};
// The same; `check_size` is called once the layer's tensors are found, before
// anything is allocated for them (a memory check), and an error stops the load.
StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer,
                                                const std::function<Status(const CheckpointLayerSize&)>& check_size);

// The files of `model_dir` that load_checkpoint_layer reads: config.json,
// model.safetensors.index.json and every shard it names, or model.safetensors;
// those that exist, as paths under model_dir. Best effort (an unreadable index
// adds no shards; the load itself reports it): for refusing an output path
// that would overwrite one of them.
std::vector<std::string> model_folder_files(const std::string& model_dir);

// Router logits [M, E] f32 = hidden . router_weight^T (+ router_bias), fp32
// products summed in ascending hidden index. hidden: host [M, H] f32|bf16|f16.
StatusOr<HostTensor> checkpoint_router_logits(const CheckpointLayer& layer, const TensorView& hidden);

}  // namespace moekit
