// Kernel attributes set once per (kernel, device) instead of on every launch:
// an eager forward launches the same few kernels each time, and the runtime call
// that raises a kernel's shared-memory limit costs host time on every call.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

namespace moekit::cuda {

// cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)
// on the current device, unless this (func, device) already got `bytes` or more.
// Thread-safe; legal while a stream is being captured.
cudaError_t ensure_kernel_smem(const void* func, int bytes);

// CTAs of `func` (at `threads` threads and `smem_bytes` of dynamic shared memory,
// raised first with ensure_kernel_smem) one SM of the current device holds at
// once; asked once per (func, device). 0 when it cannot be asked or does not fit.
int kernel_ctas_per_sm(const void* func, int threads, int smem_bytes);

// The current device's opt-in dynamic shared memory per block, 0 when it cannot
// be asked: what an instance must fit (227 KB on Hopper, 163 KB on A100, 99 KB on RTX cards).
int current_device_smem_optin();

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
