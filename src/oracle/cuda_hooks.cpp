// CUDA builds only. The CUDA backend registers its kernel classes and its
// routing here.
#include "oracle/cuda_hooks.h"

#include <cuda_runtime_api.h>

#include "experts/cuda/sm90_kernels.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda {

void append_backends(const Platform& platform, std::vector<Backend>* registry) {
  // cuda_sm90 = [Sm90Monolithic, Sm90Modular], when an sm_90 device is present.
  if (platform.has_sm90()) registry->push_back(sm90_backend());
}

Status route(const RoutingConfig& config, const RoutingArgs& args, Stream stream) {
  return route_cuda(config, args, static_cast<cudaStream_t>(stream));
}

}  // namespace moekit::cuda
