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

// Non-finite codes of each dtype, on the raw bits.
struct F32NonFinite {
  __device__ bool operator()(uint32_t v) const { return (v & 0x7f800000u) == 0x7f800000u; }
};
struct Half16NonFinite {  // bf16 or f16: the exponent field all ones
  uint16_t exp;
  __device__ bool operator()(uint16_t v) const { return (v & exp) == exp; }
};
struct E4m3NonFinite {  // e4m3fn has no Inf; S.1111.111 is NaN
  __device__ bool operator()(uint8_t v) const { return (v & 0x7fu) == 0x7fu; }
};

// *first = the smallest flat index whose code is non-finite (kNone if none).
template <class T, class NonFinite>
__global__ void first_non_finite_kernel(const T* __restrict__ p, int64_t n, NonFinite bad,
                                        unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (bad(p[i])) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later indices are larger
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
      first_non_finite_kernel<<<blocks, kThreads>>>(static_cast<const uint32_t*>(w.data), n, F32NonFinite{}, first);
      break;
    case DType::kBF16:
    case DType::kF16:
      exp16 = w.dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
      first_non_finite_kernel<<<blocks, kThreads>>>(static_cast<const uint16_t*>(w.data), n, Half16NonFinite{exp16},
                                                    first);
      break;
    case DType::kF8E4M3:
      first_non_finite_kernel<<<blocks, kThreads>>>(static_cast<const uint8_t*>(w.data), n, E4m3NonFinite{}, first);
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
