#include "layer/routing_stage.h"

#include <cstring>
#include <string>

#include "moekit/routing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {

namespace {

// Copies `bytes` between two buffers of one device, on `stream` for a CUDA
// device (no host synchronization); host_src: the source is host memory.
Status copy_to(const TensorView& dst, const void* src, size_t bytes, Stream stream, bool host_src = false) {
  if (bytes == 0) return Status::Ok();
  if (dst.device.type == DeviceType::kCpu) {
    std::memcpy(dst.data, src, bytes);
    return Status::Ok();
  }
#ifdef MOEKIT_WITH_CUDA
  const cudaMemcpyKind kind = host_src ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  const cudaError_t err = cudaMemcpyAsync(dst.data, src, bytes, kind, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return Internal(std::string("routing: copy failed: ") + cudaGetErrorString(err));
  return Status::Ok();
#else
  (void)stream;
  (void)host_src;
  return Unsupported("routing on " + dst.device.to_string() + ": this build has no CUDA support");
#endif
}

TensorView view_of(const DeviceBuffer& b, DType dtype, std::vector<int64_t> shape) {
  return TensorView::contiguous(b.data(), dtype, std::move(shape), b.device());
}

}  // namespace

StatusOr<DeviceBuffer> allocate_layer_buffer(Device device, const char* what, size_t bytes, int64_t max_num_tokens) {
  StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(device, bytes);
  if (!buffer.ok()) {
    return Status(buffer.status().code(), std::string("layer: ") + what + " for max_num_tokens = " +
                                              std::to_string(max_num_tokens) + ": " + buffer.status().message());
  }
  return buffer;
}

StatusOr<RoutingStage> RoutingStage::create(const MoeConfig& config, Device device, const TensorView& score_bias,
                                            Options options) {
  if (score_bias.defined() != config.routing.has_score_bias) {
    return InvalidArgument(config.routing.has_score_bias
                               ? "weights.score_bias: routing.has_score_bias is set but no bias was given"
                               : "weights.score_bias: a bias was given but routing.has_score_bias is not set");
  }
  RoutingStage st;
  st.config_ = config;
  st.device_ = device;
  st.options_ = options;
  const int64_t rows = config.max_num_tokens, k = config.top_k(), E = config.num_experts;
  const bool custom = config.routing.method == RoutingMethod::kCustom;
  auto allocate = [&](DeviceBuffer* b, const char* what, size_t bytes) -> Status {
    MOEKIT_ASSIGN_OR_RETURN(*b, allocate_layer_buffer(device, what, bytes, rows));
    return Status::Ok();
  };
  if (!options.in_kernel && !custom) {
    MOEKIT_RETURN_IF_ERROR(allocate(&st.topk_ids_, "topk_ids", rows * k * sizeof(int32_t)));
    MOEKIT_RETURN_IF_ERROR(allocate(&st.topk_weights_, "topk_weights", rows * k * sizeof(float)));
  }
  if (device.type == DeviceType::kCuda && !custom) {
    MOEKIT_RETURN_IF_ERROR(allocate(&st.forced_ids_, "forced_ids", rows * k * sizeof(int32_t)));
  }
  if (options.keep_load) {
    MOEKIT_RETURN_IF_ERROR(allocate(&st.counts_, "expert counts", E * sizeof(int32_t)));
    MOEKIT_RETURN_IF_ERROR(allocate(&st.load_, "expert load", E * sizeof(int64_t)));
    MOEKIT_RETURN_IF_ERROR(st.reset_load());
  }
  if (config.routing.has_score_bias) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(score_bias, "weights.score_bias", {DType::kF32}, {E}, score_bias.device));
    // A device bias may still be written on a stream the copy does not wait for.
    if (score_bias.device.type == DeviceType::kCuda) MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(device));
    MOEKIT_ASSIGN_OR_RETURN(st.score_bias_, DeviceBuffer::copy_of(device, score_bias));
  }
  return st;
}

Status RoutingStage::update_score_bias(const TensorView& score_bias) {
  if (!config_.routing.has_score_bias) {
    if (score_bias.defined()) return InvalidArgument("weights.score_bias: given, but the routing has no score bias");
    return Status::Ok();
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(score_bias, "weights.score_bias", {DType::kF32}, {config_.num_experts},
                                      score_bias.device));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(device_));
  return DeviceBuffer::copy_bytes(score_bias_.data(), device_, score_bias.data, score_bias.device,
                                  score_bias.nbytes());
}

StatusOr<Routed> RoutingStage::run(const LayerForwardArgs& args, int64_t m, const CaptureTargets& capture,
                                   Stream stream) {
  const int64_t k = config_.top_k(), E = config_.num_experts;
  Routed r;
  r.tokens.num_tokens = m;
  if (m == 0) {
    // An EP rank without tokens (or whose arguments failed): nothing of args is read.
    r.tokens.hidden = TensorView::contiguous(nullptr, config_.quant.act_dtype, {0, config_.hidden}, device_);
    return r;
  }
  r.tokens.hidden = args.hidden;
  r.ids_target = args.routing_replay_out.defined() ? args.routing_replay_out : capture.ids;
  r.forced_ids = args.forced_ids;
  if (args.forced_ids.defined() && device_.type == DeviceType::kCuda) {
    r.forced_ids = view_of(forced_ids_, DType::kI32, {m, k});
    MOEKIT_RETURN_IF_ERROR(copy_to(r.forced_ids, args.forced_ids.data, args.forced_ids.nbytes(), stream, true));
  }
  if (options_.in_kernel) return r;

  // This forward's counts: the load counters' buffer, else the caller's.
  const TensorView counts = options_.keep_load ? view_of(counts_, DType::kI32, {E}) : args.expert_counts;
  if (config_.routing.method == RoutingMethod::kCustom) {
    r.tokens.topk_ids = args.topk_ids;
    r.tokens.topk_weights = args.topk_weights;
    MOEKIT_RETURN_IF_ERROR(record_caller_ids(args.topk_ids, E, counts, r.ids_target, stream));
  } else {
    r.tokens.topk_ids = view_of(topk_ids_, DType::kI32, {m, k});
    r.tokens.topk_weights = view_of(topk_weights_, DType::kF32, {m, k});
    RoutingArgs ra;
    ra.logits = args.router_logits;
    if (score_bias_.data() != nullptr) ra.score_bias = view_of(score_bias_, DType::kF32, {E});
    ra.forced_ids = r.forced_ids;
    ra.topk_ids = r.tokens.topk_ids;
    ra.topk_weights = r.tokens.topk_weights;
    ra.expert_counts = counts;
    ra.routing_replay_out = r.ids_target;
    MOEKIT_RETURN_IF_ERROR(route(config_.routing, ra, stream));
  }
  if (capture.router_weights.defined()) {
    MOEKIT_RETURN_IF_ERROR(copy_to(capture.router_weights, r.tokens.topk_weights.data, m * k * sizeof(float), stream));
  }
  if (options_.keep_load) {
    MOEKIT_RETURN_IF_ERROR(accumulate_expert_load(counts, static_cast<int64_t*>(load_.data()), stream));
    if (args.expert_counts.defined()) {
      MOEKIT_RETURN_IF_ERROR(copy_to(args.expert_counts, counts.data, E * sizeof(int32_t), stream));
    }
  }
  return r;
}

Status RoutingStage::finish(const LayerForwardArgs& args, int64_t m, const CaptureTargets& capture,
                            Stream stream) const {
  if (m == 0 || !args.routing_replay_out.defined() || !capture.ids.defined()) return Status::Ok();
  return copy_to(capture.ids, args.routing_replay_out.data, m * config_.top_k() * sizeof(int16_t), stream);
}

Status RoutingStage::read_load(std::vector<int64_t>* load) const {
  load->assign(static_cast<size_t>(config_.num_experts), 0);
  if (!options_.keep_load) return FailedPrecondition("expert load: this layer keeps no load counters");
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(device_));  // the counters are added to on the forwards' streams
  return DeviceBuffer::copy_bytes(load->data(), Device::cpu(), load_.data(), device_, load_.bytes());
}

Status RoutingStage::reset_load() {
  if (!options_.keep_load) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(device_));  // the counters are added to on the forwards' streams
  const std::vector<int64_t> zeros(static_cast<size_t>(config_.num_experts), 0);
  return DeviceBuffer::copy_bytes(load_.data(), device_, zeros.data(), Device::cpu(), load_.bytes());
}

}  // namespace moekit
