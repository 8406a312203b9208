// Device scan for non-finite weights (weight_values.h).
#include "experts/cuda/weight_values.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "experts/quant_weights.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr unsigned long long kNone = ~0ull;

// The exponent (and for e4m3 the mantissa) bits that make a code non-finite.
template <class T>
__device__ __forceinline__ bool non_finite(T v);
template <>
__device__ __forceinline__ bool non_finite(uint32_t v) { return (v & 0x7f800000u) == 0x7f800000u; }  // f32
template <>
__device__ __forceinline__ bool non_finite(uint8_t v) { return (v & 0x7fu) == 0x7fu; }  // e4m3fn: only NaN

__device__ __forceinline__ bool non_finite_16(uint16_t v, uint16_t exp) { return (v & exp) == exp; }

// *first = the smallest flat index of a non-finite element (kNone if none).
template <class T>
__global__ void first_non_finite_kernel(const T* __restrict__ p, int64_t n, unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (non_finite(p[i])) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // later indices of this thread are larger
    }
  }
}

__global__ void first_non_finite_16_kernel(const uint16_t* __restrict__ p, int64_t n, uint16_t exp,
                                           unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (non_finite_16(p[i], exp)) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

}  // namespace

Status check_device_weight_values(const TensorView& w, const char* name) {
  if (!w.defined() || w.device.type != DeviceType::kCuda || !w.is_contiguous() || w.numel() == 0) return Status::Ok();
  const int64_t n = w.numel();
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, (n + kThreads - 1) / kThreads));
  unsigned long long* first = nullptr;
  MOEKIT_CUDA_CHECK(cudaMalloc(&first, sizeof(*first)));
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_first{first};
  MOEKIT_CUDA_CHECK(cudaMemset(first, 0xff, sizeof(*first)));  // kNone
  uint16_t exp16 = 0;
  switch (w.dtype) {
    case DType::kF32:
      first_non_finite_kernel<<<blocks, kThreads>>>(static_cast<const uint32_t*>(w.data), n, first);
      break;
    case DType::kBF16:
    case DType::kF16:
      exp16 = w.dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
      first_non_finite_16_kernel<<<blocks, kThreads>>>(static_cast<const uint16_t*>(w.data), n, exp16, first);
      break;
    case DType::kF8E4M3:
      first_non_finite_kernel<<<blocks, kThreads>>>(static_cast<const uint8_t*>(w.data), n, first);
      break;
    default: return Status::Ok();
  }
  MOEKIT_CUDA_CHECK_LAUNCH("first_non_finite_kernel");
  unsigned long long bad = kNone;
  MOEKIT_CUDA_CHECK(cudaMemcpy(&bad, first, sizeof(bad), cudaMemcpyDeviceToHost));
  if (bad == kNone) return Status::Ok();
  // NaN or Inf: read the one element back (e4m3fn has no Inf).
  bool nan = true;
  const size_t elem = dtype_size(w.dtype);
  uint32_t code = 0;
  MOEKIT_CUDA_CHECK(cudaMemcpy(&code, static_cast<const char*>(w.data) + bad * elem, elem, cudaMemcpyDeviceToHost));
  if (w.dtype == DType::kF32) nan = (code & 0x007fffffu) != 0;
  if (w.dtype == DType::kBF16 || w.dtype == DType::kF16) nan = (code & 0x7fffu) != exp16;
  return non_finite_weight_error(w, name, static_cast<int64_t>(bad), nan);
}

}  // namespace moekit::cuda
