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
  RoutingLaunch launch;
  launch.config = config;
  launch.num_tokens = M;
  launch.num_experts = E;
  launch.logits = args.logits.data;
  launch.logits_bf16 = args.logits.dtype == DType::kBF16;
  launch.score_bias = config.has_score_bias ? args.score_bias.ptr<const float>() : nullptr;
  launch.forced_ids = args.forced_ids.defined() ? args.forced_ids.ptr<const int32_t>() : nullptr;
  launch.topk_ids = args.topk_ids.ptr<int32_t>();
  launch.topk_weights = args.topk_weights.ptr<float>();
  launch.routing_replay_out = args.routing_replay_out.defined() ? args.routing_replay_out.ptr<int16_t>() : nullptr;
  launch.expert_counts = args.expert_counts.defined() ? args.expert_counts.ptr<int32_t>() : nullptr;
  return launch_routing(launch, stream);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
