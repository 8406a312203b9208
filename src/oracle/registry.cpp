// The backend registry: CUDA backends first (when this build and platform have
// them), then "cpu", which runs everywhere.
#include <memory>

#include "experts/cpu/cpu_modular.h"
#include "experts/cpu/cpu_monolithic.h"
#include "moekit/oracle.h"

#ifdef MOEKIT_WITH_CUDA
#include "oracle/cuda_hooks.h"
#endif

namespace moekit {

namespace {

template <typename Kernel>
StatusOr<std::unique_ptr<MoeKernel>> create_kernel(const MoeConfig& config, const Platform&) {
  return std::unique_ptr<MoeKernel>(std::make_unique<Kernel>(config));
}

Backend cpu_backend() {
  return Backend{"cpu",
                 {
                     KernelClass{"CpuMonolithic", true, &cpu::CpuMonolithic::supports, &create_kernel<cpu::CpuMonolithic>,
                                 /*writes_routing_replay_out=*/true},
                     KernelClass{"CpuModular", false, &cpu::CpuModular::supports, &create_kernel<cpu::CpuModular>},
                 }};
}

}  // namespace

std::vector<Backend> backend_registry(const Platform& platform) {
  std::vector<Backend> registry;
#ifdef MOEKIT_WITH_CUDA
  cuda::append_backends(platform, &registry);
#endif
  registry.push_back(cpu_backend());
  return registry;
}

}  // namespace moekit
