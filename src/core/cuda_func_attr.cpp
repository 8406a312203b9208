#include "core/cuda_func_attr.h"

#ifdef MOEKIT_WITH_CUDA

#include <atomic>
#include <mutex>
#include <vector>

namespace moekit::cuda {

namespace {
struct Entry {
  const void* func;
  int device;
  int bytes;
};
struct Occupancy {
  const void* func;
  int device, threads, smem_bytes, ctas;
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

int kernel_ctas_per_sm(const void* func, int threads, int smem_bytes) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  static std::mutex mu;
  static std::vector<Occupancy> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Occupancy& o : known) {
      if (o.func == func && o.device == device && o.threads == threads && o.smem_bytes == smem_bytes) return o.ctas;
    }
  }
  int ctas = 0;
  if (ensure_kernel_smem(func, smem_bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, func, threads, static_cast<size_t>(smem_bytes)) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  known.push_back(Occupancy{func, device, threads, smem_bytes, ctas});
  return ctas;
}

int current_device_smem_optin() {
  // Asked once per device: the GEMM path choice calls this on every forward.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < kMaxDevices) {
    if (const int known = cached[device].load(std::memory_order_relaxed); known > 0) return known;
  }
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < kMaxDevices) cached[device].store(bytes, std::memory_order_relaxed);
  return bytes;
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
