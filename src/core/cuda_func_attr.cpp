#include "core/cuda_func_attr.h"

#ifdef MOEKIT_WITH_CUDA

#include <mutex>
#include <vector>

namespace moekit::cuda {

namespace {
struct Entry {
  const void* func;
  int device;
  int bytes;
};
}  // namespace

cudaError_t ensure_kernel_smem(const void* func, int bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  // A handful of kernels per process: a short list under one lock is enough.
  static std::mutex mu;
  static std::vector<Entry> done;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& e : done) {
    if (e.func == func && e.device == device && e.bytes >= bytes) return cudaSuccess;
  }
  if (const cudaError_t e = cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess) {
    return e;
  }
  done.push_back(Entry{func, device, bytes});
  return cudaSuccess;
}

int current_device_smem_optin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return bytes;
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
