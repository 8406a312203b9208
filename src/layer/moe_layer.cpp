// MoeLayer: a chosen kernel with its prepared weights, workspace and routing
// outputs, run as one call per forward.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "core/checked_size.h"
#include "layer/forward_checks.h"
#include "moekit/device_buffer.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {

struct MoeLayer::Buffers {
  // Kernel workspace, >= workspace_size(max_num_tokens) bytes, uninitialised:
  // the layer's own, or its Model's, shared by the model's layers (one runs at a time).
  std::shared_ptr<DeviceBuffer> workspace;
  DeviceBuffer topk_ids;      // [max_num_tokens, k] i32, modular kernels: the router's ids
  DeviceBuffer topk_weights;  // [max_num_tokens, k] f32, modular kernels: the router's weights
  DeviceBuffer forced_ids;    // [max_num_tokens, k] i32, CUDA layers only: forced ids copied from the host
  DeviceBuffer score_bias;    // [E] f32, deepseek_v3 with a bias only
};

namespace {

// Copies the first `bytes` of one contiguous view (ids or weights) into another
// on the same device, on `stream` for a CUDA device (no host synchronization).
Status copy_rows(const TensorView& dst, const void* src, size_t bytes, Stream stream) {
  if (dst.device.type == DeviceType::kCpu) {
    std::memcpy(dst.data, src, bytes);
    return Status::Ok();
  }
#ifdef MOEKIT_WITH_CUDA
  const cudaError_t err =
      cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return Internal(std::string("capture target: copy failed: ") + cudaGetErrorString(err));
  return Status::Ok();
#else
  return Unsupported("capture target on " + dst.device.to_string() + ": this build has no CUDA support");
#endif
}

}  // namespace

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
                       layer->kernel_->name() + " runs on " + layer->device().to_string());
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
  if (weights.score_bias.defined() != config.routing.has_score_bias) {
    return InvalidArgument(config.routing.has_score_bias
                               ? "weights.score_bias: routing.has_score_bias is set but no bias was given"
                               : "weights.score_bias: a bias was given but routing.has_score_bias is not set");
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
  layer->buffers_ = std::make_unique<Buffers>();
  MOEKIT_ASSIGN_OR_RETURN(layer->kernel_, kernel_class.create(config, platform));
  MOEKIT_RETURN_IF_ERROR(layer->kernel_->prepare_weights(weights));
  Buffers& b = *layer->buffers_;
  const Device device = layer->kernel_->device();
  const int64_t rows = config.max_num_tokens, k = config.top_k();
  // A failed allocation names the buffer and the setting that sized it.
  auto allocate = [&](const char* what, size_t bytes) -> StatusOr<DeviceBuffer> {
    StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(device, bytes);
    if (!buffer.ok()) {
      return Status(buffer.status().code(), std::string("layer: ") + what + " for max_num_tokens = " +
                                                std::to_string(rows) + ": " + buffer.status().message());
    }
    return buffer;
  };
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer workspace, allocate("workspace", layer->kernel_->workspace_size(rows)));
  b.workspace = std::make_shared<DeviceBuffer>(std::move(workspace));
  if (!layer->kernel_->is_monolithic()) {
    MOEKIT_ASSIGN_OR_RETURN(b.topk_ids, allocate("topk_ids", rows * k * sizeof(int32_t)));
    MOEKIT_ASSIGN_OR_RETURN(b.topk_weights, allocate("topk_weights", rows * k * sizeof(float)));
  }
  if (device.type == DeviceType::kCuda && config.routing.method != RoutingMethod::kCustom) {
    MOEKIT_ASSIGN_OR_RETURN(b.forced_ids, allocate("forced_ids", rows * k * sizeof(int32_t)));
  }
  if (config.routing.has_score_bias) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(weights.score_bias, "weights.score_bias", {DType::kF32},
                                        {config.num_experts}, weights.score_bias.device));
    MOEKIT_ASSIGN_OR_RETURN(b.score_bias, DeviceBuffer::copy_of(device, weights.score_bias));
    layer->score_bias_ = TensorView::contiguous(b.score_bias.data(), DType::kF32, {config.num_experts}, device);
  }
  return layer;
}

size_t MoeLayer::workspace_bytes() const { return kernel_->workspace_size(config_.max_num_tokens); }

const std::shared_ptr<DeviceBuffer>& MoeLayer::workspace_buffer() const { return buffers_->workspace; }

Status MoeLayer::use_workspace(std::shared_ptr<DeviceBuffer> buffer) {
  if (buffer == nullptr || !(buffer->device() == device()) || buffer->bytes() < workspace_bytes()) {
    return InvalidArgument("layer: a shared workspace must be on " + device().to_string() + " with >= " +
                           std::to_string(workspace_bytes()) + " bytes");
  }
  if (has_run_) {
    return FailedPrecondition("layer: has run already; its workspace stays (a captured graph may hold its address)");
  }
  buffers_->workspace = std::move(buffer);
  return Status::Ok();
}

std::string MoeLayer::producer() const {
  return backend_.empty() ? std::string(kernel_->name()) : backend_ + "/" + kernel_->name();
}

Status MoeLayer::capture_supported() const {
  // NOTE: a monolithic kernel hides routing; unless it writes routing_replay_out
  // the ids would be lost (read later as the sentinel, or zeros). The oracle
  // rejects such a class when the config asks for capture (writes_routing_replay_out).
  if (kernel_->is_monolithic() && !kernel_->supports_routing_replay_capture()) {
    return Unsupported(std::string("the monolithic kernel ") + kernel_->name() +
                       " cannot write routed expert ids (no routing_replay_out support)");
  }
  return Status::Ok();
}

// What a capture target and a per-forward routing_replay_out both need of
// this layer (their shapes: check_ids_rows).
Status MoeLayer::check_ids_target(const TensorView& target, const char* name) const {
  if (Status s = capture_supported(); !s.ok()) return Unsupported(std::string(name) + ": " + s.message());
  if (config_.routing.method == RoutingMethod::kCustom && device().type != DeviceType::kCpu) {
    return Unsupported(std::string(name) + ": capturing caller-supplied (custom) ids is only implemented on the CPU");
  }
  return Status::Ok();
}

Status MoeLayer::router_weights_capture_supported() const {
  if (kernel_->is_monolithic() && !kernel_->supports_router_weights_capture()) {
    return Unsupported(std::string("the monolithic kernel ") + kernel_->name() +
                       " cannot write the routing weights (no router_weights_out support)");
  }
  return Status::Ok();
}

Status MoeLayer::set_capture_target(const TensorView& target, const TensorView& router_weights) {
  if (!target.defined()) {
    if (router_weights.defined()) return InvalidArgument("capture router weights: given without an ids target");
    capture_target_ = {};
    router_weights_target_ = {};
    return Status::Ok();
  }
  MOEKIT_RETURN_IF_ERROR(check_ids_target(target, "capture target"));
  MOEKIT_RETURN_IF_ERROR(
      check_ids_rows(target, "capture target", config_.max_num_tokens, "max_num_tokens", config_.top_k(), device()));
  if (router_weights.defined()) {
    if (Status s = router_weights_capture_supported(); !s.ok()) {
      return Unsupported("capture router weights: " + s.message());
    }
    MOEKIT_RETURN_IF_ERROR(check_tensor(router_weights, "capture router weights", {DType::kF32},
                                        {target.dim(0), config_.top_k()}, device()));
  }
  capture_target_ = target;
  router_weights_target_ = router_weights;
  return Status::Ok();
}

Status MoeLayer::validate(const LayerForwardArgs& args) const {
  if (args.routing_replay_out.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_ids_target(args.routing_replay_out, "routing_replay_out"));
  }
  return check_forward_args(config_, args, device());
}

Status MoeLayer::route_tokens(const LayerForwardArgs& args, int64_t m, Stream stream) {
  const int64_t k = config_.top_k();
  RoutingArgs r;
  r.logits = args.router_logits;
  r.score_bias = score_bias_;
  r.forced_ids = args.forced_ids;
  r.topk_ids = TensorView::contiguous(buffers_->topk_ids.data(), DType::kI32, {m, k}, device());
  r.topk_weights = TensorView::contiguous(buffers_->topk_weights.data(), DType::kF32, {m, k}, device());
  r.expert_counts = args.expert_counts;
  r.routing_replay_out = args.routing_replay_out;
  return route(config_.routing, r, stream);
}

Status MoeLayer::forward(const LayerForwardArgs& args, Stream stream) {
  MOEKIT_RETURN_IF_ERROR(validate(args));
  const int64_t m = args.hidden.dim(0), k = config_.top_k();
  TensorView forced = args.forced_ids;
  if (forced.defined() && device().type == DeviceType::kCuda) {
#ifdef MOEKIT_WITH_CUDA
    const cudaError_t err = cudaMemcpyAsync(buffers_->forced_ids.data(), forced.data, forced.nbytes(),
                                            cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) return Internal(std::string("forced_ids: upload failed: ") + cudaGetErrorString(err));
    forced = TensorView::contiguous(buffers_->forced_ids.data(), DType::kI32, {m, k}, device());
#endif
  }
  LayerForwardArgs routed = args;
  routed.forced_ids = forced;
  // One ids target per forward: this call's, else the bound capture target;
  // with both, the call's rows are copied into the capture target after the run.
  const TensorView ids_target = args.routing_replay_out.defined() ? args.routing_replay_out : capture_target_;
  routed.routing_replay_out = ids_target;

  MoeRunArgs run;
  run.hidden = args.hidden;
  run.out = args.out;
  if (kernel_->is_monolithic()) {
    run.router_logits = args.router_logits;
    run.forced_ids = forced;
    run.routing_replay_out = ids_target;
    run.expert_counts = args.expert_counts;
    run.router_weights_out = router_weights_target_;
  } else if (config_.routing.method == RoutingMethod::kCustom) {
    run.topk_ids = args.topk_ids;
    run.topk_weights = args.topk_weights;
    if (ids_target.defined()) {
      // Caller-supplied ids are captured as given (CPU only; see check_ids_target).
      const int32_t* ids = args.topk_ids.ptr<int32_t>();
      int16_t* dst = ids_target.ptr<int16_t>();
      for (int64_t i = 0; i < m * k; ++i) dst[i] = static_cast<int16_t>(ids[i]);
    }
    if (router_weights_target_.defined()) {
      MOEKIT_RETURN_IF_ERROR(copy_rows(router_weights_target_, args.topk_weights.data, m * k * sizeof(float), stream));
    }
  } else {
    MOEKIT_RETURN_IF_ERROR(route_tokens(routed, m, stream));
    run.topk_ids = TensorView::contiguous(buffers_->topk_ids.data(), DType::kI32, {m, k}, device());
    run.topk_weights = TensorView::contiguous(buffers_->topk_weights.data(), DType::kF32, {m, k}, device());
    if (router_weights_target_.defined()) {
      MOEKIT_RETURN_IF_ERROR(copy_rows(router_weights_target_, run.topk_weights.data, m * k * sizeof(float), stream));
    }
  }
  Workspace ws{buffers_->workspace->data(), buffers_->workspace->bytes()};
  has_run_ = true;  // from here its workspace's address may be in a captured graph
  MOEKIT_RETURN_IF_ERROR(kernel_->run(run, ws, stream));
  if (args.routing_replay_out.defined() && capture_target_.defined()) {
    return copy_rows(capture_target_, args.routing_replay_out.data, m * k * sizeof(int16_t), stream);
  }
  return Status::Ok();
}

}  // namespace moekit
