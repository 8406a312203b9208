#include "experts/cpu/cpu_modular.h"

#include "experts/cpu/cpu_kernel_checks.h"

namespace moekit::cpu {

Support CpuModular::supports(const MoeConfig& config, const Platform& platform) {
  Support s = supports_common(config, platform);
  if (!s.ok) return s;
  // Routing: any method, custom included (ids arrive precomputed).
  // Logits dtype: not read by this kernel.
  // Parallel: all-to-all configs are served; dispatch across ranks belongs to
  // the prepare/finalize stage chosen with the kernel (a shared expert runs
  // on the token's own rank, after the combine: ExpertParallelLayer).
  // Capture: the router writes the ids (modular path). Replay: the router is
  // given the forced ids.
  return Support::yes();
}

// Workspace layout of one run() over M tokens: the stage buffers only.
size_t CpuModular::workspace_size(int64_t num_tokens) const {
  ScratchLayout layout(nullptr);
  take_stage_buffers(config_, num_tokens, layout);
  return layout.bytes_needed();
}

Status CpuModular::prepare_weights(const MoeWeights& weights) {
  MOEKIT_RETURN_IF_ERROR(check_servable(supports(config_, Platform::cpu_only())));
  if (weights.score_bias.defined()) {
    MOEKIT_RETURN_IF_ERROR(
        check_tensor(weights.score_bias, "score_bias", {DType::kF32}, {config_.num_experts}, Device::cpu()));
  }
  return experts_.prepare(config_, weights);
}

Status CpuModular::run(const MoeRunArgs& args, Workspace workspace, Stream /*stream: CPU runs inline*/) {
  int64_t M = 0;
  MOEKIT_RETURN_IF_ERROR(check_run_inputs(args, &M));
  MOEKIT_RETURN_IF_ERROR(check_topk(config_, args, M));
  MOEKIT_RETURN_IF_ERROR(check_workspace(workspace, workspace_size(M)));
  // Everything is valid: compute.
  ScratchLayout layout(ScratchLayout::aligned(workspace.data));
  const StageBuffers stages = take_stage_buffers(config_, M, layout);
  run_stages(args, args.topk_ids.ptr<const int32_t>(), args.topk_weights.ptr<const float>(), M, stages);
  return Status::Ok();
}

}  // namespace moekit::cpu
