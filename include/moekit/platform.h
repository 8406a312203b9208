// Platform: what this process can run on, probed once, fakeable in tests.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "moekit/status.h"

namespace moekit {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
  size_t total_memory = 0;
};

struct Platform {
  int cpu_threads = 1;
  bool cuda_built = false;       // this build contains CUDA kernels
  bool sm90a_built = false;      // ... compiled for sm_90a (wgmma, TMA)
  bool portable_built = false;   // ... and the portable kernels (cuda_sm80) for sm_80 on
  std::vector<CudaDeviceInfo> cuda_devices;  // empty when none is usable

  // Probes the real machine (CPU threads, CUDA devices). Cheap after the first call.
  static const Platform& probe();
  // A machine with CPUs only (for tests and forced CPU runs).
  static Platform cpu_only(int threads = 1);
  bool has_sm90() const;  // a device with compute capability 9.0 is present and sm_90a kernels are built
  // A device of compute capability 8.0 or later is present and the portable kernels are built.
  bool has_cuda_portable() const;
  static constexpr int kPortableMinCcMajor = 8;
  std::string to_string() const;
};

// Makes CUDA device `index` current on the calling thread (one thread per
// GPU, as expert-parallel ranks run). Unsupported in a build without CUDA.
Status set_current_cuda_device(int index);

// The CPU threads moekit computes with: its parallel_for pool and OpenBLAS's
// own threads (the f32 GEMM path), both set to `num_threads` (in [1, 1024]).
// Inside a torch process, torch's intra-op threads are the natural value
// (moekit's Python package sets that on import); more would oversubscribe.
Status set_num_threads(int num_threads);

}  // namespace moekit
