// Device row gather for the prepared W13 layout (weight_layout.h).
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "experts/cuda/weight_layout.h"

namespace moekit::cuda {

namespace {

// One block per destination row; 16-byte copies when H allows.
__global__ void relayout_w13_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t n1,
                                    int64_t hidden, Activation kind, int64_t intermediate) {
  const int64_t e = blockIdx.y;
  const int64_t r = blockIdx.x;
  const int64_t s = w13_source_row(kind, intermediate, r);
  const uint16_t* from = src + (e * n1 + s) * hidden;
  uint16_t* to = dst + (e * n1 + r) * hidden;
  if (hidden % 8 == 0) {
    for (int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x)
      reinterpret_cast<uint4*>(to)[i] = reinterpret_cast<const uint4*>(from)[i];
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) to[i] = from[i];
  }
}

}  // namespace

Status relayout_w13(const uint16_t* src, uint16_t* dst, int64_t num_experts, int64_t n1, int64_t hidden,
                    Activation kind, int64_t intermediate, cudaStream_t stream) {
  if (num_experts == 0 || n1 == 0) return Status::Ok();
  if (n1 > 0x7fffffff || num_experts > 65535) return InvalidArgument("relayout_w13: E or N1 too large");
  relayout_w13_kernel<<<dim3(static_cast<unsigned>(n1), static_cast<unsigned>(num_experts)), 128, 0, stream>>>(
      src, dst, n1, hidden, kind, intermediate);
  MOEKIT_CUDA_CHECK_LAUNCH("relayout_w13_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda
