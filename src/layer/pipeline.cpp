#include "layer/pipeline.h"

#include <string>
#include <utility>

namespace moekit {

LayerPipeline::LayerPipeline(RoutingStage routing, std::unique_ptr<dispatch::PrepareFinalize> pf,
                             std::unique_ptr<MoeKernel> experts, std::shared_ptr<DeviceBuffer> workspace)
    : routing_(std::move(routing)),
      pf_(std::move(pf)),
      experts_(std::move(experts)),
      workspace_(std::move(workspace)) {}

StatusOr<std::shared_ptr<DeviceBuffer>> LayerPipeline::allocate_workspace(const MoeKernel& experts) {
  const int64_t rows = experts.config().max_num_tokens;
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                          allocate_layer_buffer(experts.device(), "workspace", experts.workspace_size(rows), rows));
  return std::make_shared<DeviceBuffer>(std::move(buffer));
}

size_t LayerPipeline::workspace_bytes() const { return experts_->workspace_size(experts_->config().max_num_tokens); }

Status LayerPipeline::use_workspace(std::shared_ptr<DeviceBuffer> buffer) {
  if (buffer == nullptr || !(buffer->device() == experts_->device()) || buffer->bytes() < workspace_bytes()) {
    return InvalidArgument("layer: a shared workspace must be on " + experts_->device().to_string() + " with >= " +
                           std::to_string(workspace_bytes()) + " bytes");
  }
  if (has_run_) {
    return FailedPrecondition("layer: has run already; its workspace stays (a captured graph may hold its address)");
  }
  workspace_ = std::move(buffer);
  return Status::Ok();
}

void LayerPipeline::replace_experts(std::unique_ptr<MoeKernel> experts, std::shared_ptr<DeviceBuffer> workspace,
                                    std::unique_ptr<dispatch::PrepareFinalize> pf) {
  experts_ = std::move(experts);
  workspace_ = std::move(workspace);
  pf_ = std::move(pf);
}

Status LayerPipeline::forward(const LayerForwardArgs& args, const Status& verdict, const CaptureTargets& capture,
                              Stream stream) {
  bool without_tokens = false;
  MOEKIT_RETURN_IF_ERROR(pf_ != nullptr ? pf_->admit(verdict, &without_tokens) : verdict);
  const int64_t m = without_tokens ? 0 : args.hidden.dim(0);
  MOEKIT_ASSIGN_OR_RETURN(Routed routed, routing_.run(args, m, capture, stream));
  const Workspace ws{workspace_->data(), workspace_->bytes()};
  has_run_ = true;
  if (pf_ == nullptr) {
    // A monolithic kernel routes inside; the routing stage chose the ids target and uploaded forced ids.
    MoeRunArgs run;
    run.hidden = args.hidden;
    run.out = args.out;
    run.router_logits = args.router_logits;
    run.forced_ids = routed.forced_ids;
    run.routing_replay_out = routed.ids_target;
    run.expert_counts = args.expert_counts;
    run.router_weights_out = capture.router_weights;
    MOEKIT_RETURN_IF_ERROR(experts_->run(run, ws, stream));
  } else {
    const TensorView out =
        m > 0 ? args.out : TensorView::contiguous(nullptr, routed.tokens.hidden.dtype, {0, experts_->config().hidden},
                                                  routed.tokens.hidden.device);
    MOEKIT_ASSIGN_OR_RETURN(MoeRunArgs run, pf_->prepare(routed.tokens, out, stream));
    const Status ran = run.hidden.dim(0) > 0 ? experts_->run(run, ws, stream) : Status::Ok();
    MOEKIT_RETURN_IF_ERROR(pf_->finalize(routed.tokens, ran, out, stream));
  }
  MOEKIT_RETURN_IF_ERROR(routing_.finish(args, m, capture, stream));
  return verdict;
}

}  // namespace moekit
