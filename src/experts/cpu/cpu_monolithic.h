// CpuMonolithic: router_logits and hidden in, out out, routing inside
// (route_cpu), then the same experts stage as CpuModular (CpuKernel), so both
// kernels give bitwise equal outputs for the same routing. Writes the selected
// ids into routing_replay_out when given (capture) and accepts forced ids
// (replay).
#pragma once

#include <vector>

#include "experts/cpu/cpu_kernel.h"

namespace moekit::cpu {

class CpuMonolithic : public CpuKernel {
 public:
  explicit CpuMonolithic(MoeConfig config) : CpuKernel(std::move(config)) {}

  // Built-in routing methods only; no all-to-all, no EPLB.
  static Support supports(const MoeConfig& config, const Platform& platform);

  const char* name() const override { return "CpuMonolithic"; }
  bool is_monolithic() const override { return true; }
  bool supports_routing_replay_capture() const override { return true; }
  bool supports_router_weights_capture() const override { return true; }

  size_t workspace_size(int64_t num_tokens) const override;
  // w13 [E, 2I, H] ([E, I, H] for relu2), w2 [E, H, I], in the config's weight
  // dtype (kept packed bf16 or as fp32 copies, per cpu_gemm_path()); score_bias
  // [E] f32 required exactly when routing.has_score_bias.
  Status prepare_weights(const MoeWeights& weights) override;
  // Reads hidden, router_logits, optional forced_ids; writes out and, when
  // given, routing_replay_out rows [0, M) and expert_counts. Validates every
  // argument before writing anything; allocates nothing.
  Status run(const MoeRunArgs& args, Workspace workspace, Stream stream) override;

 private:
  struct Scratch;
  std::vector<float> score_bias_;  // [E] f32 copy, empty unless routing.has_score_bias
};

}  // namespace moekit::cpu
