// CpuModular: the CPU MoE layer as separate stages, from precomputed routing
// (topk_ids/topk_weights, from any routing method including user code):
// local prepare -> experts stage -> local finalize.
#pragma once

#include "experts/cpu/cpu_kernel.h"

namespace moekit::cpu {

class CpuModular : public CpuKernel {
 public:
  explicit CpuModular(MoeConfig config) : CpuKernel(std::move(config)) {}

  // Every dtype pair of f32|bf16, every activation and routing method (custom
  // too), all-to-all configs, capture (the router writes the ids) and replay.
  static Support supports(const MoeConfig& config, const Platform& platform);

  const char* name() const override { return "CpuModular"; }
  bool is_monolithic() const override { return false; }

  size_t workspace_size(int64_t num_tokens) const override;
  // w13 [E, 2I, H] ([E, I, H] for relu2), w2 [E, H, I], in the config's weight
  // dtype; kept packed bf16 or as fp32 copies (2x a bf16 checkpoint in memory)
  // as cpu_gemm_path() says. score_bias is not used (routing happens outside)
  // and is checked only when given.
  Status prepare_weights(const MoeWeights& weights) override;
  // Reads hidden, topk_ids, topk_weights; writes out. Validates every argument
  // before writing anything; allocates nothing.
  Status run(const MoeRunArgs& args, Workspace workspace, Stream stream) override;
};

}  // namespace moekit::cpu
