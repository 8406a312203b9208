// MoeLayer: a chosen kernel with its prepared weights, workspace and routing
// stage, run through the one layer pipeline (layer/pipeline.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "core/checked_size.h"
#include "layer/forward_checks.h"
#include "layer/pipeline.h"
#include "moekit/device_buffer.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

namespace moekit {

MoeLayer::~MoeLayer() = default;

StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::from_resolution(Resolution res, const MoeConfig& config,
                                                              const MoeWeights& weights, const Platform& platform) {
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, create_with(config, weights, res.kernel, platform));
  layer->backend_ = res.backend;
  layer->report_ = std::move(res.report);
  return layer;
}

StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::create(const MoeConfig& config, const MoeWeights& weights,
                                                     const Platform& platform) {
  MOEKIT_ASSIGN_OR_RETURN(Resolution res, select_backend(config, platform));
  return from_resolution(std::move(res), config, weights, platform);
}

StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::create(const MoeConfig& config, const MoeWeights& weights,
                                                     Device device, const Platform& platform) {
  MOEKIT_ASSIGN_OR_RETURN(Resolution res, select_backend_on(config, platform, device.type));
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, from_resolution(std::move(res), config, weights, platform));
  if (!(layer->device() == device)) {
    return Unsupported("layer: asked for " + device.to_string() + ", but " + layer->backend_ + "/" +
                       layer->kernel().name() + " runs on " + layer->device().to_string());
  }
  return layer;
}

StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::create_with(const MoeConfig& config, const MoeWeights& weights,
                                                          const KernelClass& kernel_class,
                                                          const Platform& platform) {
  MOEKIT_RETURN_IF_ERROR(config.validate());
  if (kernel_class.supports == nullptr || kernel_class.create == nullptr) {
    return InvalidArgument("layer: kernel class '" + kernel_class.name + "' has no supports()/create()");
  }
  const Support s = kernel_class.supports(config, platform);
  if (!s.ok) return Unsupported("layer: " + kernel_class.name + " cannot serve this configuration: " + s.reason);
  // NOTE: a MoeLayer runs every expert on one rank; expert parallelism needs
  // a communicator and the EP prepare/finalize, which ExpertParallelLayer wires.
  const ParallelConfig& par = config.parallel;
  if (par.tp_size > 1 || par.ep_size > 1 || par.dp_size > 1) {
    return Unsupported("layer: tp/ep/dp > 1 (tp=" + std::to_string(par.tp_size) + ", ep=" +
                       std::to_string(par.ep_size) + ", dp=" + std::to_string(par.dp_size) +
                       ") is not a single-rank layer: expert parallelism runs through ExpertParallelLayer "
                       "(moekit/ep_layer.h) with a communicator; tensor parallelism is not implemented");
  }

  // The buffers are sized from max_num_tokens by size arithmetic in the kernels
  // (workspace_size) and here, unchecked. Bound it first: when the bytes of one
  // token's rows (every per-token extent, 64 bytes each, a wide margin over any
  // buffer's element size and count) times max_num_tokens do not fit int64, a
  // size would wrap into a small buffer. Such a layer could never be allocated:
  // refuse it as the failed allocation it is.
  {
    auto add = [](std::optional<int64_t> a, int64_t b) -> std::optional<int64_t> {
      if (!a || b < 0 || *a > INT64_MAX - b) return std::nullopt;
      return *a + b;
    };
    std::optional<int64_t> per_token = checked_mul(config.top_k(), std::max<int64_t>(config.intermediate, 0));
    if (per_token) per_token = checked_mul(*per_token, 2);
    per_token = add(add(add(add(per_token, 1), config.hidden), config.num_experts), config.shared_intermediate);
    if (per_token) per_token = checked_mul(*per_token, 64);
    if (per_token) per_token = checked_mul(*per_token, config.max_num_tokens);
    if (!per_token) {
      return ResourceExhausted("layer: buffers for max_num_tokens = " + std::to_string(config.max_num_tokens) +
                               " (H = " + std::to_string(config.hidden) + ", I = " +
                               std::to_string(config.intermediate) + ", k = " + std::to_string(config.top_k()) +
                               ") exceed any address space");
    }
  }

  std::unique_ptr<MoeLayer> layer(new MoeLayer());
  layer->config_ = config;
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeKernel> kernel, kernel_class.create(config, platform));
  RoutingStage::Options routing_options;
  routing_options.in_kernel = kernel->is_monolithic();
  MOEKIT_ASSIGN_OR_RETURN(RoutingStage routing,
                          RoutingStage::create(config, kernel->device(), weights.score_bias, routing_options));
  MOEKIT_RETURN_IF_ERROR(kernel->prepare_weights(weights));
  MOEKIT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceBuffer> workspace, LayerPipeline::allocate_workspace(*kernel));
  std::unique_ptr<dispatch::PrepareFinalize> pf =
      kernel->is_monolithic() ? nullptr : dispatch::make_local_prepare_finalize();
  layer->pipeline_ = std::make_unique<LayerPipeline>(std::move(routing), std::move(pf), std::move(kernel),
                                                     std::move(workspace));
  return layer;
}

const MoeKernel& MoeLayer::kernel() const { return pipeline_->experts(); }

Device MoeLayer::device() const { return pipeline_->experts().device(); }

size_t MoeLayer::workspace_bytes() const { return pipeline_->workspace_bytes(); }

const std::shared_ptr<DeviceBuffer>& MoeLayer::workspace_buffer() const { return pipeline_->workspace_buffer(); }

Status MoeLayer::use_workspace(std::shared_ptr<DeviceBuffer> buffer) {
  return pipeline_->use_workspace(std::move(buffer));
}

bool MoeLayer::has_run() const { return pipeline_->has_run(); }

std::string MoeLayer::report_string() const {
  std::string s = report_.empty() ? std::string()
                                  : format_report(report_) + "resolved: " + backend_ + " / " + kernel().name() + "\n";
  char ws[96];
  std::snprintf(ws, sizeof ws, "workspace: %.1f MiB for max_num_tokens = %lld%s\n",
                static_cast<double>(workspace_bytes()) / (1 << 20), static_cast<long long>(config_.max_num_tokens),
                pipeline_->workspace_buffer()->bytes() > workspace_bytes() ? " (runs in a larger shared one)" : "");
  return s + format_gemm_plan(kernel(), config_.max_num_tokens) + ws;
}

std::string MoeLayer::producer() const {
  return backend_.empty() ? std::string(kernel().name()) : backend_ + "/" + kernel().name();
}

Status MoeLayer::capture_supported() const {
  // NOTE: a monolithic kernel hides routing; unless it writes routing_replay_out
  // the ids would be lost (read later as the sentinel, or zeros). The oracle
  // rejects such a class when the config asks for capture (writes_routing_replay_out).
  if (kernel().is_monolithic() && !kernel().supports_routing_replay_capture()) {
    return Unsupported(std::string("the monolithic kernel ") + kernel().name() +
                       " cannot write routed expert ids (no routing_replay_out support)");
  }
  return Status::Ok();
}

Status MoeLayer::router_weights_capture_supported() const {
  if (kernel().is_monolithic() && !kernel().supports_router_weights_capture()) {
    return Unsupported(std::string("the monolithic kernel ") + kernel().name() +
                       " cannot write the routing weights (no router_weights_out support)");
  }
  return Status::Ok();
}

Status MoeLayer::set_capture_target(const TensorView& target, const TensorView& router_weights) {
  MOEKIT_RETURN_IF_ERROR(check_capture_targets(*this, target, router_weights));
  capture_target_ = target;
  router_weights_target_ = target.defined() ? router_weights : TensorView{};
  return Status::Ok();
}

Status MoeLayer::forward(const LayerForwardArgs& args, Stream stream) {
  if (!update_failure_.ok()) {
    return FailedPrecondition("layer: its last update_weights failed (" + update_failure_.message() +
                              "); it runs again after an update that succeeds");
  }
  const CaptureTargets capture{capture_target_, router_weights_target_};
  return pipeline_->forward(args, check_forward_args(*this, args), capture, stream);
}

Status MoeLayer::update_weights(const MoeWeights& weights) {
  Status st = pipeline_->experts().prepare_weights(weights);
  if (st.ok()) st = pipeline_->routing().update_score_bias(weights.score_bias);
  update_failure_ = st;
  return st;
}

Status MoeLayer::update_score_bias(const TensorView& score_bias) {
  if (!score_bias.defined()) return InvalidArgument("score_bias: expected the new [E] f32 selection bias");
  return pipeline_->routing().update_score_bias(score_bias);
}

}  // namespace moekit
