// CUDA builds only. The CUDA backend registers its kernel classes here.
#include "oracle/cuda_hooks.h"

#include <utility>

#include "experts/cuda/sm90_kernels.h"

namespace moekit::cuda {

void append_backends(const Platform& platform, std::vector<Backend>* registry) {
  // cuda_sm90 = [Sm90Monolithic, Sm90Modular], when an sm_90 device is present;
  // then cuda_sm80 = [Sm80Monolithic, Sm80Modular], the portable kernels, on any
  // device from sm_80 on (on Hopper it stays second: the oracle takes the first
  // backend that supports a config, and says why the ones before it did not).
  if (platform.has_sm90()) {
    Backend sm90 = sm90_backend();
    sm90.device_type = DeviceType::kCuda;  // each class declares its capture capability (oracle_test checks it)
    registry->push_back(std::move(sm90));
  }
  if (platform.has_cuda_portable()) {
    Backend sm80 = sm80_backend();
    sm80.device_type = DeviceType::kCuda;
    registry->push_back(std::move(sm80));
  }
}

}  // namespace moekit::cuda
