// Expert-parallel combine on the device (step 6): see ep_dispatch.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "dispatch/cuda/ep_dispatch.h"

namespace moekit::dispatch::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kVec = 8;  // bf16 per 16-byte access

// Grid (m, column tiles): each thread sums 8 columns of one token over the ranks.
__global__ void __launch_bounds__(kThreads) combine_partials_kernel(EpDeviceShape s, CombineArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t h = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kVec;
  if (h >= s.hidden) return;
  bool bad_id = false;
  for (int64_t j = 0; j < s.top_k; ++j) {
    const int32_t e = a.topk_ids[t * s.top_k + j];
    bad_id |= e < 0 || e >= s.num_logical;
  }
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = bad_id ? __int_as_float(0x7fc00000) : 0.0f;  // NaN: invalid expert id
  if (!bad_id) {
    for (int64_t d = 0; d < s.ranks; ++d) {
      const int32_t r = a.row_of[d * s.max_tokens + t];
      if (r < 0) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(a.returned + (d * s.max_tokens + r) * s.hidden + h);
      const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += __bfloat162float(p[i]);
    }
  }
  if (a.shared_out != nullptr) {
    const float g = a.shared_gate != nullptr ? a.shared_gate[t] : 1.0f;
    const uint4 v = *reinterpret_cast<const uint4*>(a.shared_out + t * s.hidden + h);
    const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = fmaf(g, __bfloat162float(p[i]), acc[i]);
  }
  uint4 o;
  __nv_bfloat16* ob = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
  for (int i = 0; i < kVec; ++i) ob[i] = __float2bfloat16_rn(acc[i]);
  *reinterpret_cast<uint4*>(a.out + t * s.hidden + h) = o;
}

}  // namespace

Status ep_combine_partials(const EpDeviceShape& s, const CombineArgs& a, cudaStream_t stream) {
  if (s.hidden % kVec != 0) return InvalidArgument("ep device combine: hidden must be a multiple of 8");
  if (a.num_tokens == 0) return Status::Ok();
  const dim3 grid(static_cast<unsigned>(a.num_tokens),
                  static_cast<unsigned>((s.hidden / kVec + kThreads - 1) / kThreads));
  combine_partials_kernel<<<grid, kThreads, 0, stream>>>(s, a);
  MOEKIT_CUDA_CHECK_LAUNCH("combine_partials_kernel");
  return Status::Ok();
}

}  // namespace moekit::dispatch::cuda
