// The kernel interface every MoE kernel class implements (docs/design.md §2.2):
// supports -> workspace_size -> prepare_weights (once) -> run(stream).
// run() neither allocates nor synchronizes with the host, so a forward can be
// captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "moekit/config.h"
#include "moekit/platform.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

// supports(): ok, or the first failing reason in the fixed order
// device/arch -> dtypes/quant -> activation -> routing method -> logits dtype ->
// parallel config -> shape/alignment -> capture/replay needs.
struct Support {
  bool ok = true;
  std::string reason;  // empty when ok
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

struct ProblemSize {
  int64_t num_experts = 0;  // E
  int64_t num_tokens = 0;   // M
  int64_t n = 0;            // GEMM1 output columns: 2I (gated) or I
  int64_t k = 0;            // GEMM1 reduction: H
  int64_t top_k = 0;
  std::string to_string() const;
};

// Weights as the checkpoint holds them (host or device views).
struct MoeWeights {
  TensorView w13;         // [E, 2I, H] (gated; gate rows first, or interleaved for swiglu_oai) or [E, I, H] (relu2)
  TensorView w2;          // [E, H, I]
  TensorView score_bias;  // [E] f32, optional (deepseek_v3 e_score_correction_bias)
  // iff config.has_expert_bias (f32 or the weight dtype):
  TensorView w13_bias{};  // [E, n1]: added to GEMM1's output (w13's row order) before the activation
  TensorView w2_bias{};   // [E, H]: added to each expert's output, so the layer adds sum_j w_j * w2_bias[e_j]
  // iff config.shared_intermediate = Is > 0 (weight dtype), a gated MLP with the
  // layer's activation and w13's row layout, applied to every token, its output
  // added to the routed sum (times sigmoid(x . shared_gate) when gated):
  TensorView shared_w13{};   // [2 Is, H] (relu2: [Is, H])
  TensorView shared_w2{};    // [H, Is]
  TensorView shared_gate{};  // [H] f32 or weight dtype, iff config.has_shared_gate
  // fp8 schemes only (config.quant.method; layouts in docs/fp8.md), f32, every value finite and > 0:
  //   fp8_block128:   w13_scale [E, P*ceil(I/128), ceil(H/128)], w2_scale [E, ceil(H/128), ceil(I/128)]
  //   fp8_per_tensor: w13_scale [E, P], w2_scale [E]
  // P = 2 parts (gate, up) when gated, 1 for relu2; w13 row r belongs to part r / I. Real weight =
  // e4m3 value * scale of its block (or part).
  TensorView w13_scale;
  TensorView w2_scale;
  // fp8_per_tensor with static activation scales: [E] f32 each, the scale of GEMM1's input (hidden)
  // and of GEMM2's input (the activation output) for each expert.
  TensorView a13_scale;
  TensorView a2_scale;
};

struct MoeRunArgs {
  TensorView hidden;  // [M, H] act dtype
  TensorView out;     // [M, H] act dtype; every element overwritten
  // Monolithic kernels (routing inside):
  TensorView router_logits;       // [M, E] f32|bf16
  TensorView forced_ids;          // [M, k] i32, optional: replay
  TensorView routing_replay_out;  // [>=M, k] i16, optional: capture target, rows [0, M)
  TensorView expert_counts;       // [E] i32, optional: tokens per expert
  // Modular kernels (routing done by the caller):
  TensorView topk_ids;      // [M, k] i32
  TensorView topk_weights;  // [M, k] f32
  // Monolithic kernels with supports_router_weights_capture(), optional: [>= M, k] f32,
  // rows [0, M) get the routing weights of the ids (capture of router weights).
  TensorView router_weights_out;
  // Modular kernels of an expert-parallel rank: a negative id means "this slot
  // is computed on another rank" and contributes nothing (a row whose ids are
  // all negative outputs 0). Off (the default), an id outside [0, E) is an
  // error or, where only the device can see it, makes the token's row NaN.
  // Served by the cuda_sm90 modular kernel (bf16); others refuse it.
  bool skip_negative_ids = false;
};

// Caller-owned scratch memory on the kernel's device, >= workspace_size(M) bytes.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

class MoeKernel {
 public:
  explicit MoeKernel(MoeConfig config) : config_(std::move(config)) {}
  virtual ~MoeKernel() = default;
  MoeKernel(const MoeKernel&) = delete;
  MoeKernel& operator=(const MoeKernel&) = delete;

  virtual const char* name() const = 0;
  virtual bool is_monolithic() const = 0;
  // Monolithic kernels that write the selected ids into routing_replay_out.
  virtual bool supports_routing_replay_capture() const { return false; }
  // Monolithic kernels that also write the routing weights into router_weights_out.
  virtual bool supports_router_weights_capture() const { return false; }
  virtual Device device() const = 0;

  // Understands every weight layout this kernel prepares.
  virtual StatusOr<ProblemSize> problem_size(const TensorView& hidden, const TensorView& w13,
                                             const TensorView& w2, const TensorView& topk_ids) const = 0;
  virtual size_t workspace_size(int64_t num_tokens) const = 0;
  // Once, before run(); may copy and re-lay-out the weights.
  virtual Status prepare_weights(const MoeWeights& weights) = 0;
  virtual Status run(const MoeRunArgs& args, Workspace workspace, Stream stream) = 0;
  // The GEMM paths a forward of num_tokens tokens takes and why, one line
  // (kernel options and the backend's tile table applied).
  virtual std::string gemm_plan(int64_t num_tokens) const = 0;

  const MoeConfig& config() const { return config_; }

 protected:
  MoeConfig config_;
};

}  // namespace moekit
