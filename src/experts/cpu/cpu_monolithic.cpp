#include "experts/cpu/cpu_monolithic.h"

#include <algorithm>

#include "experts/cpu/cpu_kernel_checks.h"
#include "moekit/routing.h"

namespace moekit::cpu {

// Workspace layout of one run() over M tokens.
struct CpuMonolithic::Scratch {
  StageBuffers stages;
  int32_t* topk_ids = nullptr;    // [M, k] i32, routing output
  float* topk_weights = nullptr;  // [M, k] f32, routing output

  Scratch(const MoeConfig& c, int64_t M, ScratchLayout& layout) {
    stages = take_stage_buffers(c, M, layout);
    topk_ids = layout.take<int32_t>(M * c.top_k());
    topk_weights = layout.take<float>(M * c.top_k());
  }
};

Support CpuMonolithic::supports(const MoeConfig& config, const Platform& platform) {
  Support s = supports_common(config, platform);
  if (!s.ok) return s;
  // Routing: every built-in method (route_cpu's switch is exhaustive); custom has no router.
  if (config.routing.method == RoutingMethod::kCustom) return Support::no("custom routing needs a modular kernel");
  if (config.logits_dtype != DType::kF32 && config.logits_dtype != DType::kBF16) {
    return Support::no(std::string("router logits dtype ") + dtype_name(config.logits_dtype) +
                       " not supported (f32 or bf16)");
  }
  if (config.parallel.use_all2all()) {
    return Support::no("monolithic kernels cannot dispatch tokens across ranks (all-to-all)");
  }
  if (config.parallel.enable_eplb) {
    return Support::no("monolithic kernels do not remap logical experts to EPLB replicas");
  }
  // Capture: ids written into routing_replay_out. Replay: forced_ids accepted.
  return Support::yes();
}

size_t CpuMonolithic::workspace_size(int64_t num_tokens) const {
  ScratchLayout layout(nullptr);
  Scratch(config_, num_tokens, layout);
  return layout.bytes_needed();
}

Status CpuMonolithic::prepare_weights(const MoeWeights& weights) {
  MOEKIT_RETURN_IF_ERROR(check_servable(supports(config_, Platform::cpu_only())));
  if (config_.routing.has_score_bias) {
    MOEKIT_RETURN_IF_ERROR(
        check_tensor(weights.score_bias, "score_bias", {DType::kF32}, {config_.num_experts}, Device::cpu()));
  } else if (weights.score_bias.defined()) {
    return InvalidArgument("score_bias: given, but routing.has_score_bias is false");
  }
  MOEKIT_RETURN_IF_ERROR(experts_.prepare(config_, weights));
  if (config_.routing.has_score_bias) {
    const float* b = weights.score_bias.ptr<const float>();
    score_bias_.assign(b, b + config_.num_experts);
  } else {
    score_bias_.clear();
  }
  return Status::Ok();
}

Status CpuMonolithic::run(const MoeRunArgs& args, Workspace workspace, Stream /*stream: CPU runs inline*/) {
  int64_t M = 0;
  MOEKIT_RETURN_IF_ERROR(check_run_inputs(args, &M));
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.router_logits, "router_logits", {config_.logits_dtype},
                                      {M, config_.num_experts}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_workspace(workspace, workspace_size(M)));
  if (args.router_weights_out.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(args.router_weights_out, "router_weights_out", {DType::kF32},
                                        {-1, config_.top_k()}, Device::cpu()));
    if (args.router_weights_out.dim(0) < M) {
      return InvalidArgument("router_weights_out: needs at least M = " + std::to_string(M) + " rows, got " +
                             args.router_weights_out.shape_string());
    }
  }

  ScratchLayout layout(ScratchLayout::aligned(workspace.data));
  const Scratch s(config_, M, layout);
  const int64_t k = config_.top_k();
  RoutingArgs routing;
  routing.logits = args.router_logits;
  if (!score_bias_.empty()) {
    routing.score_bias = TensorView::contiguous(score_bias_.data(), DType::kF32, {config_.num_experts});
  }
  routing.forced_ids = args.forced_ids;
  routing.topk_ids = TensorView::contiguous(s.topk_ids, DType::kI32, {M, k});
  routing.topk_weights = TensorView::contiguous(s.topk_weights, DType::kF32, {M, k});
  routing.expert_counts = args.expert_counts;
  routing.routing_replay_out = args.routing_replay_out;
  // Shapes, dtypes, forced ids, counts and routing_replay_out are checked here, logit
  // values by route_cpu, all before anything is written: on error nothing
  // user-visible has been touched.
  MOEKIT_RETURN_IF_ERROR(validate_routing_args(config_.routing, routing, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(route_cpu(config_.routing, routing));
  if (args.router_weights_out.defined()) {
    std::copy(s.topk_weights, s.topk_weights + M * k, args.router_weights_out.ptr<float>());
  }

  run_stages(args, s.topk_ids, s.topk_weights, M, s.stages);
  return Status::Ok();
}

}  // namespace moekit::cpu
