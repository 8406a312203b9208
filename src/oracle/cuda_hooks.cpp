// CUDA builds only. The CUDA backend registers its kernel classes here.
#include "oracle/cuda_hooks.h"

#include <utility>

#include "experts/cuda/sm90_kernels.h"

namespace moekit::cuda {

void append_backends(const Platform& platform, std::vector<Backend>* registry) {
  // cuda_sm90 = [Sm90Monolithic, Sm90Modular], when an sm_90 device is present.
  if (!platform.has_sm90()) return;
  Backend sm90 = sm90_backend();
  sm90.device_type = DeviceType::kCuda;  // each class declares its capture capability (oracle_test checks it)
  registry->push_back(std::move(sm90));
}

}  // namespace moekit::cuda
