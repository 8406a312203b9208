#include "moekit/platform.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {

namespace {
Platform probe_once() {
  Platform p;
  p.cpu_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#ifdef MOEKIT_WITH_CUDA
  p.cuda_built = true;
#ifdef MOEKIT_CUDA_SM90A_BUILT
  p.sm90a_built = true;  // MOEKIT_CUDA_ARCHS holds 90a
#endif
#ifdef MOEKIT_CUDA_PORTABLE_BUILT
  p.portable_built = true;  // MOEKIT_CUDA_PORTABLE_ARCHS / _PTX are not empty
#endif
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: a CPU-only platform
    count = 0;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.sm_count = prop.multiProcessorCount;
    d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
    d.smem_per_block_optin = prop.sharedMemPerBlockOptin;
    d.total_memory = prop.totalGlobalMem;
    p.cuda_devices.push_back(d);
  }
#endif
  return p;
}
}  // namespace

const Platform& Platform::probe() {
  static const Platform platform = probe_once();
  return platform;
}

Platform Platform::cpu_only(int threads) {
  Platform p;
  p.cpu_threads = threads;
  return p;
}

bool Platform::has_sm90() const {
  if (!sm90a_built) return false;
  for (const auto& d : cuda_devices) {
    if (d.cc_major == 9 && d.cc_minor == 0) return true;
  }
  return false;
}

bool Platform::has_cuda_portable() const {
  if (!portable_built) return false;
  for (const auto& d : cuda_devices) {
    if (d.cc_major >= kPortableMinCcMajor) return true;
  }
  return false;
}

std::string Platform::to_string() const {
  std::ostringstream os;
  os << "cpu threads=" << cpu_threads << ", cuda build=" << (cuda_built ? "yes" : "no");
  if (cuda_devices.empty()) os << ", no CUDA device";
  for (const auto& d : cuda_devices) {
    os << ", cuda:" << d.index << " " << d.name << " (sm_" << d.cc_major << d.cc_minor << ", " << d.sm_count
       << " SMs)";
  }
  return os.str();
}

Status set_current_cuda_device(int index) {
#ifdef MOEKIT_WITH_CUDA
  if (const cudaError_t e = cudaSetDevice(index); e != cudaSuccess) {
    return Internal("cudaSetDevice(" + std::to_string(index) + "): " + cudaGetErrorString(e));
  }
  return Status::Ok();
#else
  return Unsupported("set_current_cuda_device(" + std::to_string(index) + "): this build has no CUDA");
#endif
}

}  // namespace moekit
