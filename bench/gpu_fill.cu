// Seeded device fill; the recipe is stated in gpu_fill.h.
#include "gpu_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace moekit::bench {
namespace {

__host__ __device__ inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ inline float uniform_value(uint64_t i, uint32_t seed_mixed, float scale) {
  const uint32_t h = mix32(static_cast<uint32_t>(i) ^ mix32(static_cast<uint32_t>(i >> 32) ^ seed_mixed));
  const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * scale;
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, int64_t n, uint32_t seed_mixed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = uniform_value(static_cast<uint64_t>(i), seed_mixed, scale);
    if constexpr (sizeof(T) == 1) {
      dst[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else if constexpr (sizeof(T) == 2) {
      const __nv_bfloat16 b = __float2bfloat16_rn(v);
      dst[i] = *reinterpret_cast<const uint16_t*>(&b);
    } else {
      dst[i] = v;
    }
  }
}

template <typename T>
cudaError_t launch_fill(T* dst, int64_t n, uint32_t seed, int scale_log2, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const float scale = ldexpf(1.0f, scale_log2);
  const int64_t blocks64 = (n + 255) / 256;
  const int blocks = static_cast<int>(blocks64 < 65536 ? blocks64 : 65536);
  fill_kernel<T><<<blocks, 256, 0, stream>>>(dst, n, mix32(seed), scale);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fill_uniform_bf16(uint16_t* dst, int64_t n, uint32_t seed, int scale_log2, cudaStream_t stream) {
  return launch_fill(dst, n, seed, scale_log2, stream);
}

cudaError_t fill_uniform_f32(float* dst, int64_t n, uint32_t seed, int scale_log2, cudaStream_t stream) {
  return launch_fill(dst, n, seed, scale_log2, stream);
}

cudaError_t fill_uniform_e4m3(uint8_t* dst, int64_t n, uint32_t seed, cudaStream_t stream) {
  // 448 = 2^8 * 1.75: scale_log2 8 gives [-256, 256), inside the e4m3 range.
  return launch_fill(dst, n, seed, 8, stream);
}

}  // namespace moekit::bench
