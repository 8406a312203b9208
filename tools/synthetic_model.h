// A small synthetic MoE model for `moekit run`: seeded bf16 expert weights, a
// router gate and a score bias per layer, and token embeddings, all derived
// from one seed so every run of the same flags computes the same thing.
//
// Each MoE layer of the model computes, on a residual stream h [M, H] f32:
//   x = rmsnorm(h) (bf16);  logits = x . gate^T (f32);  h += moe(x, logits)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/layer.h"
#include "moekit/platform.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::tools {

struct SyntheticModelSpec {
  int num_layers = 4;
  int64_t num_experts = 64;
  int top_k = 8;
  int64_t hidden = 1024;
  int64_t intermediate = 512;
  int num_groups = 8;               // deepseek_v3 expert groups
  int topk_groups = 4;              // deepseek_v3 groups kept
  float routed_scaling_factor = 2.5f;
  int64_t max_num_tokens = 512;     // rows per step (the engine's token budget)
  uint64_t seed = 1234;
};

// The MoeConfig of every layer: deepseek_v3 routing with a score bias,
// silu-gated experts, bf16 weights and activations, f32 logits, on `backend`.
MoeConfig synthetic_config(const SyntheticModelSpec& spec, const std::string& backend = "cpu");

// One layer's tensors, host-resident.
struct SyntheticLayer {
  HostTensor gate;        // [E, H] f32 router weight
  HostTensor w13;         // [E, 2I, H] bf16, gate rows first
  HostTensor w2;          // [E, H, I] bf16
  HostTensor score_bias;  // [E] f32 e_score_correction_bias (selection only)

  MoeWeights weights() const {
    MoeWeights w;
    w.w13 = w13.view();
    w.w2 = w2.view();
    w.score_bias = score_bias.view();
    return w;
  }
};

// Builds layer `layer` (deterministic in spec.seed and layer; threads split
// the work without changing the values).
SyntheticLayer build_synthetic_layer(const SyntheticModelSpec& spec, int layer);

// The model: its MoE layers (kernels chosen by the oracle, weights prepared)
// and each layer's router gate. MoE layer l is layer 2l + 1 of the model (dense
// layers in between, as in DeepSeek-V3's first layers, are not simulated).
struct SyntheticModel {
  Model model;
  std::vector<HostTensor> gates;         // per MoE layer: [E, H] f32 router weight
  std::vector<HostTensor> router_biases;  // per MoE layer: [E] f32, or empty (shape {}); none for a synthetic model
};
// Builds and prepares one layer at a time, so only one bf16 copy is alive.
StatusOr<SyntheticModel> build_synthetic_model(const SyntheticModelSpec& spec, const MoeConfig& config,
                                               const Platform& platform);

// `moekit run --model DIR`: the MoE layers of a model folder, each with its
// checkpoint router (and router bias), in place of the synthetic ones; the
// embeddings, rmsnorm and residual stream stay synthetic. spec_of_model_folder
// reads only config.json: spec's sizes from the first MoE layer (E, k, H, I),
// num_layers = the MoE layers, and their model layer indices.
Status spec_of_model_folder(const std::string& dir, SyntheticModelSpec* spec, std::vector<int>* moe_layers);
// Loads and prepares every MoE layer (one at a time), each with its own
// config (max_num_tokens, backend and capture as `run_config` says, bf16
// activations as the run's residual stream takes); *config gets the first's.
StatusOr<SyntheticModel> build_checkpoint_model(const std::string& dir, const std::vector<int>& moe_layers,
                                                const MoeConfig& run_config, const Platform& platform,
                                                MoeConfig* config);

// The embedding of token `position` of request `request`: [H] values of unit
// RMS written into row `dst` of h [*, H] f32.
void embed_token(const SyntheticModelSpec& spec, int request, int64_t position, float* dst);

// x = rmsnorm(h) rounded to bf16: h [M, H] f32 -> x [M, H] bf16.
void rmsnorm_to_bf16(const float* h, int64_t M, int64_t H, uint16_t* x);

// logits [M, E] f32 = x [M, H] bf16 . gate [E, H]^T f32.
void router_logits(const uint16_t* x, const float* gate, int64_t M, int64_t E, int64_t H, float* logits);

}  // namespace moekit::tools
