// Weighted top-k reduction: see finalize.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "experts/cuda/finalize.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kVec = 8;  // bf16 per 16-byte access

// Slots whose (row, weight, id) a block stages in shared memory at a time: one
// parallel load per slot instead of a dependent global load before each row's read.
constexpr int kSlotChunk = 32;

__global__ void finalize_kernel(FinalizeArgs a) {
  static_assert(kThreads >= kSlotChunk, "one thread stages one slot");
  __shared__ int32_t slot_row[kSlotChunk];
  __shared__ float slot_weight[kSlotChunk];
  __shared__ int32_t slot_id[kSlotChunk];
  const int64_t t = blockIdx.x;
  const int64_t h = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kVec;
  const bool active = h < a.hidden;  // the block stays whole for its barriers
  const bool need_ids = a.w2_bias != nullptr || a.skip_negative_ids;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int64_t j0 = 0; j0 < a.top_k; j0 += kSlotChunk) {
    const int chunk = a.top_k - j0 < kSlotChunk ? static_cast<int>(a.top_k - j0) : kSlotChunk;
    __syncthreads();  // the previous chunk is read by every thread
    if (threadIdx.x < chunk) {
      const int64_t at = t * a.top_k + j0 + threadIdx.x;
      slot_row[threadIdx.x] = a.pair_row[at];
      slot_weight[threadIdx.x] = a.topk_weights[at];
      slot_id[threadIdx.x] = need_ids ? a.topk_ids[at] : 0;
    }
    __syncthreads();
    if (!active) continue;
#pragma unroll 4
    for (int jj = 0; jj < chunk; ++jj) {
      const int32_t row = slot_row[jj];
      const float w = slot_weight[jj];
      if (row < 0) {
        if (a.skip_negative_ids && slot_id[jj] < 0) continue;  // computed on another rank
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] = __int_as_float(0x7fc00000);  // NaN: invalid expert id
        continue;
      }
      float y[kVec];
      if (a.expert_partials != nullptr) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = 0.0f;
        for (int64_t s = 0; s < a.k_splits; ++s) {
          const float4* p =
              reinterpret_cast<const float4*>(a.expert_partials + (s * a.partial_rows + row) * a.hidden + h);
          const float4 lo = p[0], hi = p[1];
          y[0] += lo.x, y[1] += lo.y, y[2] += lo.z, y[3] += lo.w;
          y[4] += hi.x, y[5] += hi.y, y[6] += hi.z, y[7] += hi.w;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = __bfloat162float(__float2bfloat16_rn(y[i]));  // as a bf16 expert row
      } else {
        const uint4 v = *reinterpret_cast<const uint4*>(a.expert_out + static_cast<int64_t>(row) * a.hidden + h);
        const __nv_bfloat16* yb = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = __bfloat162float(yb[i]);
      }
      if (a.w2_bias != nullptr) {
        const float* b = a.w2_bias + static_cast<int64_t>(slot_id[jj]) * a.hidden + h;
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] += b[i];
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w, y[i], acc[i]);
    }
  }
  if (!active) return;
  if (a.shared_out != nullptr) {
    const float g = a.shared_gate != nullptr ? a.shared_gate[t] : 1.0f;
    const uint4 v = *reinterpret_cast<const uint4*>(a.shared_out + t * a.hidden + h);
    const __nv_bfloat16* sb = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = fmaf(g, __bfloat162float(sb[i]), acc[i]);
  }
  uint4 o;
  __nv_bfloat16* ob = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
  for (int i = 0; i < kVec; ++i) ob[i] = __float2bfloat16_rn(acc[i]);
  *reinterpret_cast<uint4*>(a.out + t * a.hidden + h) = o;
}

}  // namespace

Status finalize_weighted_sum(const FinalizeArgs& args, cudaStream_t stream) {
  if (args.hidden % kVec != 0) return InvalidArgument("finalize: hidden must be a multiple of 8");
  if (args.num_tokens == 0) return Status::Ok();
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>((args.hidden / kVec + kThreads - 1) / kThreads));
  finalize_kernel<<<grid, kThreads, 0, stream>>>(args);
  MOEKIT_CUDA_CHECK_LAUNCH("finalize_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda
