// One launch of a CUTLASS 3.x sm90 kernel from its Arguments, as the device
// adapter (GemmUniversalAdapter) would do it, but with the kernel's shared-memory
// attribute set once per device (ensure_kernel_smem) rather than on every call:
// the adapter's initialize() and cluster launcher each make a
// cudaFuncSetAttribute call per launch, host time an eager forward pays.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "moekit/status.h"

namespace moekit::cuda {

// Kernel: a cutlass::gemm::kernel::GemmUniversal; kClusterM CTAs per cluster along M.
// `what` names the GEMM in errors. The caller checked can_implement().
template <class Kernel, int kClusterM>
Status launch_cutlass_kernel(const typename Kernel::Arguments& args, void* workspace, cudaStream_t stream,
                             const char* what) {
  const cutlass::Status s = Kernel::initialize_workspace(args, workspace, stream);
  if (s != cutlass::Status::kSuccess) {
    return Internal(std::string(what) + " workspace: " + cutlassGetStatusString(s));
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  const void* kernel = reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>);
  constexpr int kSmem = Kernel::SharedStorageSize;
  MOEKIT_CUDA_CHECK(ensure_kernel_smem(kernel, kSmem));
  cudaLaunchConfig_t config{};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kClusterM;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  void* kernel_args[] = {&params};
  MOEKIT_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, kernel_args));
  return Status::Ok();
}

}  // namespace moekit::cuda
