#include "experts/cpu/cpu_modular.h"

#include "dispatch/local_prepare_finalize.h"
#include "experts/cpu/cpu_kernel_checks.h"

namespace moekit::cpu {

// Workspace layout of one run() over M tokens.
struct CpuModular::Scratch {
  float* x = nullptr;  // [M, H] f32, prepared activations (only when acts are bf16)
  float* y = nullptr;  // [M, H] f32, layer output before finalize (only when acts are bf16)
  CpuExperts::Buffers experts;

  Scratch(const MoeConfig& c, int64_t M, ScratchLayout& layout) {
    const int64_t act_rows = c.quant.act_dtype == DType::kF32 ? 0 : M;
    x = layout.take<float>(act_rows * c.hidden);
    y = layout.take<float>(act_rows * c.hidden);
    experts = CpuExperts::take_buffers(c, M, layout);
  }
};

Support CpuModular::supports(const MoeConfig& config, const Platform& platform) {
  Support s = supports_common(config, platform);
  if (!s.ok) return s;
  // Routing: any method, custom included (ids arrive precomputed).
  // Logits dtype: not read by this kernel.
  // Parallel: all-to-all configs are served; dispatch across ranks belongs to
  // the prepare/finalize stage chosen with the kernel.
  // Capture: the router writes the ids (modular path). Replay: the router is
  // given the forced ids.
  return Support::yes();
}

StatusOr<ProblemSize> CpuModular::problem_size(const TensorView& hidden, const TensorView& w13,
                                               const TensorView& w2, const TensorView& topk_ids) const {
  return cpu_problem_size(config_, hidden, w13, w2, topk_ids);
}

size_t CpuModular::workspace_size(int64_t num_tokens) const {
  ScratchLayout layout(nullptr);
  Scratch(config_, num_tokens, layout);
  return layout.bytes_needed();
}

Status CpuModular::prepare_weights(const MoeWeights& weights) {
  MOEKIT_RETURN_IF_ERROR(config_.validate());
  const Support s = supports(config_, Platform::cpu_only());
  if (!s.ok) return Unsupported(std::string(name()) + ": " + s.reason);
  if (weights.score_bias.defined()) {
    MOEKIT_RETURN_IF_ERROR(
        check_tensor(weights.score_bias, "score_bias", {DType::kF32}, {config_.num_experts}, Device::cpu()));
  }
  return experts_.prepare(config_, weights.w13, weights.w2);
}

Status CpuModular::run(const MoeRunArgs& args, Workspace workspace, Stream /*stream: CPU runs inline*/) {
  if (!experts_.prepared()) return FailedPrecondition(std::string(name()) + ": run() before prepare_weights()");
  int64_t M = 0;
  MOEKIT_RETURN_IF_ERROR(check_hidden_and_out(config_, args, &M));
  MOEKIT_RETURN_IF_ERROR(check_topk(config_, args, M));
  MOEKIT_RETURN_IF_ERROR(check_workspace(workspace, workspace_size(M)));
  // Everything is valid: compute.
  ScratchLayout layout(ScratchLayout::aligned(workspace.data));
  const Scratch s(config_, M, layout);
  const float* x = dispatch::local_prepare(args.hidden, s.x);
  float* y = dispatch::local_output_buffer(args.out, s.y);
  experts_.apply(x, args.topk_ids.ptr<const int32_t>(), args.topk_weights.ptr<const float>(), M, y, s.experts);
  dispatch::local_finalize(y, args.out);
  return Status::Ok();
}

}  // namespace moekit::cpu
