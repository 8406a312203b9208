// The weights of one MoE layer from a safetensors checkpoint, for
// `moekit layer` (docs/layer_files.md). Recognised namings:
//   moekit:      [<prefix>]w13 [E, 2I, H], [<prefix>]w2 [E, H, I]
//   per-expert:  <prefix>experts.<e>.gate_proj.weight [I, H], .up_proj.weight [I, H],
//                .down_proj.weight [H, I]            (DeepSeek, Qwen-MoE, ...)
//   Mixtral:     <prefix>experts.<e>.w1.weight (gate), .w3.weight (up), .w2.weight (down)
// plus, next to them, the router <prefix>gate.weight [E, H] and the
// e_score_correction_bias [E] (<prefix>e_score_correction_bias or
// <prefix>gate.e_score_correction_bias). Tensors bf16 or f32, or expert
// weights in F8_E4M3 with their scales (layer_fp8_scales.h, docs/fp8.md).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "layer_fp8_scales.h"
#include "moekit/io.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::tools {

struct LayerCheckpoint {
  HostTensor w13;         // [E, 2I, H] checkpoint dtype (f32|bf16|f8_e4m3), gate rows then up rows
  HostTensor w2;          // [E, H, I] same dtype
  HostTensor score_bias;  // [E] f32, empty (numel 0) when the file has none
  HostTensor router;      // [E, H] f32, empty when the file has none
  std::string naming;     // "moekit", "gate_proj/up_proj/down_proj", "w1/w3/w2"
  std::string prefix;     // the name prefix of the layer's tensors
  Fp8Scales fp8;          // method kNone unless the weights are F8_E4M3
  // The shared expert (DeepSeek <prefix>shared_experts.*, Qwen2-MoE
  // <prefix>shared_expert.* with <prefix>shared_expert_gate.weight), or empty.
  HostTensor shared_w13;   // [2 Is, H] the experts' dtype: gate rows then up rows
  HostTensor shared_w2;    // [H, Is]
  HostTensor shared_gate;  // [H] f32, or empty
  std::string shared_prefix;  // "<prefix>shared_experts." when found
  bool has_bias() const { return !score_bias.shape().empty(); }
  bool has_router() const { return !router.shape().empty(); }
  bool has_shared() const { return !shared_w13.shape().empty(); }
};

// The sizes of the layer found, before its weights are copied out of the file.
struct LayerSize {
  int64_t num_experts = 0;   // E
  int64_t w13_rows = 0;      // N: 2I (gated) or I
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  DType dtype = DType::kBF16;
};
// Called once the layer's tensors are found and checked, before anything is
// allocated for them (e.g. to compare what the command will need with what
// the machine has); an error stops the load.
using LayerSizeCheck = std::function<Status(const LayerSize&)>;

// Finds the layer's tensors; `layer` picks "layers.<N>." when the file holds
// several layers (required then). Errors name what is missing or inconsistent.
StatusOr<LayerCheckpoint> load_layer_checkpoint(const io::SafetensorsFile& file, std::optional<int> layer,
                                                 const LayerSizeCheck& check_size = {});

}  // namespace moekit::tools
