// One MoE layer of a checkpoint, read by one loader whatever holds it:
//  - a model folder, as the `transformers` library's save_pretrained writes it
//    (config.json and safetensors shards, with model.safetensors.index.json
//    when sharded): the MoeConfig built from the config's own fields;
//  - a layer file: one safetensors file of one layer's tensors, without a
//    config (`moekit layer --weights`); the sizes come from the tensors.
// Every naming in use is read (per-expert gate/up/down or w1/w3/w2, fused
// gate_up_proj/down_proj, moekit's stacked w13/w2), in BF16, F32 or F8_E4M3
// with its scales, MXFP4 (gpt-oss) and compressed-tensors INT4 (per-expert
// weight_packed), with biases, the router and shared experts. A tensor under
// the layer's prefix that the layer does not use is refused by name, never
// ignored. Shards are memory-mapped; only the layer's tensors are read.
// Families, namings and fields read: docs/layer_files.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/io.h"
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
  std::string shared_prefix;       // where its shared expert was found, e.g. "<prefix>shared_experts."
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
  // Quantized experts (config.quant says which scheme): scales in the
  // MoeWeights layouts (kernel.h), f32 for fp8 and int4, u8 E8M0 codes for
  // mxfp4; empty otherwise. 4-bit w13/w2 are u8 [E, n1, H/2] / [E, H, I/2].
  HostTensor w13_scale, w2_scale;
  HostTensor a13_scale, a2_scale;  // [E], static activation scales only

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

// How a model folder's layer is read; the defaults are load_checkpoint_layer's.
struct CheckpointLoadOptions {
  // gpt-oss's MXFP4 experts as stored rather than dequantized to bf16:
  // config.quant mxfp4 (weights u8), w13 [E, 2I, H/2] and w2 [E, H, I/2] the
  // packed bytes (rows interleaved gate/up, as in bf16), w13_scale
  // [E, 2I, H/32] and w2_scale [E, H, I/32] their u8 E8M0 exponents.
  // compressed-tensors INT4 experts are read packed either way.
  bool keep_packed_weights = false;
  // As load_checkpoint_layer's check_size; empty: no check.
  std::function<Status(const CheckpointLayerSize&)> check_size;
};
StatusOr<CheckpointLayer> load_checkpoint_layer(const std::string& model_dir, int layer,
                                                const CheckpointLoadOptions& options);

// The MoeConfig config.json gives model layer `layer` (routing, sizes, extras;
// dtypes and the selection bias are the tensors' to say): for code that routes
// a live model's blocks without loading them. Errors as load_checkpoint_layer's.
StatusOr<MoeConfig> checkpoint_layer_config(const std::string& config_json, int layer);

// The same from a model's config.json text and its tensors in one safetensors
// image in memory (e.g. a live transformers block serialized, with
// "model.layers.<layer>." names): the reader of model folders, without files.
// An image made by SafetensorsFile::parse_borrowed is read in place where its
// layout is moekit's: the expert weights of the result are then views of the
// caller's bytes (HostTensor::borrowed), which must outlive them.
StatusOr<CheckpointLayer> load_checkpoint_layer_in_memory(const std::string& config_json, io::SafetensorsFile tensors,
                                                          int layer);
StatusOr<CheckpointLayer> load_checkpoint_layer_in_memory(const std::string& config_json, io::SafetensorsFile tensors,
                                                          int layer, const CheckpointLoadOptions& options);

// A layer file (docs/layer_files.md): the one MoE layer of `file`, or, when the
// file holds several ("layers.<N>." in their names), layer `layer`. config
// gets E, H, I and the quantization from the tensors, and the shared expert's
// width; routing and activation are the caller's (the file says nothing of
// them), so config is not validated here. w13 holds gate rows then up rows
// ([E, 2I, H]) for per-expert namings; the stacked naming keeps its rows.
// Stacked 4-bit weights (`moekit quantize --scheme mxfp4|int4_g32|int4_g128`):
// w13/w2 U8 with w13_scale/w2_scale, U8 for mxfp4, F32 for int4 (the group
// told by the scales' width).
StatusOr<CheckpointLayer> load_layer_file(io::SafetensorsFile file, std::optional<int> layer,
                                          const std::function<Status(const CheckpointLayerSize&)>& check_size = {});

// Tensor names of the per-expert namings: which expert and which projection.
enum class Projection : uint8_t { kGate, kUp, kDown };
// <prefix>experts.<expert>.<projection>.weight
struct ExpertTensorName {
  std::string prefix;  // everything before "experts."
  int64_t expert = 0;
  bool mixtral = false;  // w1/w3/w2, else gate_proj/up_proj/down_proj
  Projection projection = Projection::kGate;
};
// NOTE: expert ids are captured as int16, so E <= 32767 (RoutingConfig::validate).
inline constexpr int64_t kMaxExpertIndex = 32766;
// nullopt: not an expert tensor's name. An error: it is one, but its index is
// not a decimal number in [0, kMaxExpertIndex] without leading zeros (two
// spellings of one index would make two tensors claim one expert).
StatusOr<std::optional<ExpertTensorName>> parse_expert_tensor_name(std::string_view name);
// The prefix of a stacked "<prefix>w13" tensor's name, else nullopt.
std::optional<std::string> stacked_w13_prefix(std::string_view name);

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
