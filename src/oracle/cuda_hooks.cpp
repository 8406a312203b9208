// CUDA builds only. The CUDA backend registers its kernel classes and its
// routing here; until it does, a CUDA build offers only the "cpu" backend.
#include "oracle/cuda_hooks.h"

namespace moekit::cuda {

void append_backends(const Platform& platform, std::vector<Backend>* registry) {}

Status route(const RoutingConfig& config, const RoutingArgs& args, Stream stream) {
  return Unsupported("routing on a CUDA device is not available in this build");
}

}  // namespace moekit::cuda
