// route_cuda(): validation of device views, then launch_routing().
#include "routing/cuda/route_cuda.h"

#ifdef MOEKIT_WITH_CUDA

#include <string>

#include "core/cuda_check.h"

namespace moekit::cuda {

Status route_cuda(const RoutingConfig& config, const RoutingArgs& args, cudaStream_t stream) {
  if (args.logits.device.type != DeviceType::kCuda) {
    return InvalidArgument("logits: expected a CUDA device, got " + args.logits.device.to_string());
  }
  const Device device = args.logits.device;
  MOEKIT_RETURN_IF_ERROR(validate_routing_args(config, args, device));
  const int64_t M = args.logits.shape[0];
  const int64_t E = args.logits.shape[1];
  MOEKIT_RETURN_IF_ERROR(routing_supported(config, E));
  if (M > INT32_MAX / 64) return InvalidArgument("logits: too many rows for the device router");
  int current = -1;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) {
    return InvalidArgument("logits: on " + device.to_string() + " but the current CUDA device is cuda:" +
                           std::to_string(current));
  }
  return launch_routing(
      make_routing_launch(config, args.logits, config.has_score_bias ? args.score_bias.ptr<const float>() : nullptr,
                          args.forced_ids, args.topk_ids.ptr<int32_t>(), args.topk_weights.ptr<float>(),
                          args.routing_replay_out,
                          args.expert_counts.defined() ? args.expert_counts.ptr<int32_t>() : nullptr),
      stream);
}

RoutingLaunch make_routing_launch(const RoutingConfig& config, const TensorView& logits, const float* score_bias,
                                  const TensorView& forced_ids, int32_t* topk_ids, float* topk_weights,
                                  const TensorView& routing_replay_out, int32_t* expert_counts) {
  RoutingLaunch launch;
  launch.config = config;
  launch.num_tokens = logits.shape[0];
  launch.num_experts = logits.shape[1];
  launch.logits = logits.data;
  launch.logits_bf16 = logits.dtype == DType::kBF16;
  launch.score_bias = score_bias;
  launch.forced_ids = forced_ids.defined() ? forced_ids.ptr<const int32_t>() : nullptr;
  launch.topk_ids = topk_ids;
  launch.topk_weights = topk_weights;
  launch.routing_replay_out = routing_replay_out.defined() ? routing_replay_out.ptr<int16_t>() : nullptr;
  launch.expert_counts = expert_counts;
  return launch;
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
