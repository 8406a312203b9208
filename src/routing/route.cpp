// route(): the device-generic entry of the routing spec. The logits' device
// picks the implementation; both validate before they write.
#include "moekit/routing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "routing/cuda/route_cuda.h"
#endif

namespace moekit {

Status route(const RoutingConfig& cfg, const RoutingArgs& args, Stream stream) {
  if (!args.logits.defined()) return InvalidArgument("logits: required tensor is missing");
  switch (args.logits.device.type) {
    case DeviceType::kCpu: return route_cpu(cfg, args);
    case DeviceType::kCuda:
#ifdef MOEKIT_WITH_CUDA
      return cuda::route_cuda(cfg, args, static_cast<cudaStream_t>(stream));
#else
      return Unsupported("routing on " + args.logits.device.to_string() + ": this build has no CUDA support");
#endif
  }
  return Internal("route: unknown device type");
}

}  // namespace moekit
