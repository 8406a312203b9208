// Device passes of expert_extras.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/expert_extras.h"
#include "experts/cuda/grouped_gemm.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// The group holding permuted row r, or -1: groups are laid out in expert order
// (align.h), so it is the last group starting at or before r, if r is inside it.
__device__ int group_of_row(const int32_t* start, const int32_t* rows, int num_groups, int r) {
  int lo = 0, hi = num_groups;  // first group with start > r is in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (start[mid] <= r) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int g = lo - 1;
  return g >= 0 && r < start[g] + rows[g] ? g : -1;
}

// One block per permuted row; threads over intermediate columns.
__global__ void bias_activation_kernel(BiasActivationArgs a, ActivationParams act, bool gated) {
  const int r = blockIdx.x;
  const int e = group_of_row(a.group_start, a.group_rows, static_cast<int>(a.num_groups), r);
  if (e < 0) return;
  const uint16_t* in = a.gemm1_out + static_cast<int64_t>(r) * a.n1;
  const float* b = a.bias + static_cast<int64_t>(e) * a.n1;
  uint16_t* out = a.inter + static_cast<int64_t>(r) * a.intermediate;
  for (int64_t i = threadIdx.x; i < a.intermediate; i += blockDim.x) {
    float v;
    if (gated) {
      const int64_t gate = (i / kGateUpBlock) * 2 * kGateUpBlock + i % kGateUpBlock;  // NOTE: grouped_gemm.h layout
      const int64_t up = gate + kGateUpBlock;
      v = gated_activation(act, bf16_to_f32(in[gate]) + b[gate], bf16_to_f32(in[up]) + b[up]);
    } else {
      v = plain_activation(act, bf16_to_f32(in[i]) + b[i]);
    }
    out[i] = f32_to_bf16(v);
  }
}

__global__ void single_group_kernel(int32_t* start, int32_t* rows, int32_t n) {
  start[0] = 0;
  rows[0] = n;
}

// One warp per token: a dot product over H, then the sigmoid.
__global__ void shared_gate_kernel(const uint16_t* hidden, const float* w, int64_t M, int64_t H, float* gate) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= M) return;
  float s = 0.0f;
  for (int64_t c = lane; c < H; c += 32) s = fmaf(bf16_to_f32(hidden[t * H + c]), w[c], s);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) gate[t] = 1.0f / (1.0f + expf(-s));
}

}  // namespace

Status bias_activation(const BiasActivationArgs& args, cudaStream_t stream) {
  if (args.max_rows == 0) return Status::Ok();
  if (args.max_rows > INT32_MAX) return InvalidArgument("bias_activation: more than 2^31 rows");
  const int threads = args.intermediate >= kThreads ? kThreads : 64;
  const ActivationParams act{args.activation.kind, args.activation.swiglu_limit, args.activation.swiglu_alpha};
  bias_activation_kernel<<<static_cast<unsigned>(args.max_rows), threads, 0, stream>>>(args, act,
                                                                                        args.activation.gated());
  MOEKIT_CUDA_CHECK_LAUNCH("bias_activation_kernel");
  return Status::Ok();
}

Status write_single_group(int32_t* group_start, int32_t* group_rows, int64_t rows, cudaStream_t stream) {
  single_group_kernel<<<1, 1, 0, stream>>>(group_start, group_rows, static_cast<int32_t>(rows));
  MOEKIT_CUDA_CHECK_LAUNCH("single_group_kernel");
  return Status::Ok();
}

Status shared_gate_scores(const uint16_t* hidden, const float* weight, int64_t num_tokens, int64_t hidden_size,
                          float* gate, cudaStream_t stream) {
  if (num_tokens == 0) return Status::Ok();
  const int64_t blocks = (num_tokens * 32 + kThreads - 1) / kThreads;
  shared_gate_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(hidden, weight, num_tokens, hidden_size,
                                                                               gate);
  MOEKIT_CUDA_CHECK_LAUNCH("shared_gate_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda
