// The fp8 expert stages: see fp8_experts.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/fp8_experts.h"

namespace moekit::cuda {

namespace {

constexpr int kBlock = static_cast<int>(kFp8BlockSize);
constexpr int kWarps = 4;  // per CTA, every kernel here

// NOTE: the rounding of fp8_emulation.h, operation for operation (IEEE f32
// division and product, RNE e4m3 with saturation): the cpu backend and these
// kernels give the same quantized values for the same inputs.
__device__ __forceinline__ float act_scale_of(float amax) {
  return __fdiv_rn(fmaxf(amax, kFp8ScaleFloor), kFp8E4M3Max);
}
__device__ __forceinline__ float e4m3_value(__nv_fp8_storage_t q) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
}
__device__ __forceinline__ __nv_fp8_storage_t quantize(float x, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}
// Value v at column c of row r: as an e4m3 byte (the tensor-core path) or as its f32 value.
__device__ __forceinline__ void store_quantized(const Fp8QuantizeArgs& a, int64_t r, int64_t c, float v, float scale) {
  const __nv_fp8_storage_t q = quantize(v, scale);
  if (a.dst_q) {
    a.dst_q[r * a.cols + c] = q;
  } else {
    a.dst[r * a.cols + c] = __fmul_rn(e4m3_value(q), scale);
  }
}
// The scale of (row r of group g, column block kb) where Fp8GemmLaunch::a_scale reads it.
__device__ __forceinline__ float* scale_slot(const Fp8QuantizeArgs& a, int g, int64_t r, int64_t kb) {
  const int64_t start = a.group_start[g], k_blocks = (a.cols + kBlock - 1) / kBlock;
  return a.dst_scale + start * k_blocks + kb * a.group_rows[g] + (r - start);
}
__device__ __forceinline__ float load(const void* src, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(src)[i]) : static_cast<const float*>(src)[i];
}
// Column c of source row `src_row`: the stored value, or the activation of GEMM1's outputs.
__device__ __forceinline__ float source_value(const Fp8QuantizeArgs& a, int64_t src_row, int64_t c) {
  if (!a.activation) return load(a.src, a.src_bf16, src_row * a.ld + c);
  const float* row = static_cast<const float*>(a.src) + src_row * a.ld;
  const ActivationParams p{a.act.kind, a.act.swiglu_limit, a.act.swiglu_alpha};
  switch (a.act.kind) {
    case Activation::kSiluGated:
    case Activation::kGeluGated: return gated_activation(p, row[c], row[a.cols + c]);
    case Activation::kSwigluOai: return gated_activation(p, row[2 * c], row[2 * c + 1]);
    case Activation::kRelu2: return plain_activation(p, row[c]);
  }
  return row[c];
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The group (expert) of permuted row r, or -1 when r lies in none; found by
// thread 0 and handed to the whole block (every thread must call it). Starts
// ascend with g (an empty group starts where the next one does), so the last
// group starting at or before r is the only one that can hold it.
__device__ int block_group_of(int64_t r, const int32_t* start, const int32_t* rows, int64_t E) {
  __shared__ int group;
  if (threadIdx.x == 0) {
    int64_t lo = 0, hi = E;  // the answer lies in [lo, hi) once start[lo] <= r
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (start[mid] <= r) lo = mid; else hi = mid;
    }
    group = E > 0 && r >= start[lo] && r < static_cast<int64_t>(start[lo]) + rows[lo] ? static_cast<int>(lo) : -1;
  }
  __syncthreads();
  return group;
}

// amax over the rows inside groups (max is order-free: any reduction order gives the same value).
__global__ void amax_kernel(Fp8QuantizeArgs a, float* amax) {
  const int64_t r = blockIdx.x;
  const int group = block_group_of(r, a.group_start, a.group_rows, a.num_experts);
  if (group < 0) return;
  const int64_t src_row = a.row_index ? a.row_index[r] : r;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) m = fmaxf(m, fabsf(source_value(a, src_row, c)));
  m = warp_max(m);
  // Non-negative floats order as their bit patterns.
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

__global__ void quantize_kernel(Fp8QuantizeArgs a, Fp8ActQuant q) {
  const int64_t r = blockIdx.x;
  const int group = block_group_of(r, a.group_start, a.group_rows, a.num_experts);
  if (group < 0) return;
  const int64_t src_row = a.row_index ? a.row_index[r] : r;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (q.method == QuantMethod::kFp8Block128) {
    // One warp per 128-column group, 4 values per lane.
    for (int64_t c0 = static_cast<int64_t>(warp) * kBlock; c0 < a.cols; c0 += kWarps * kBlock) {
      float v[4];
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t c = c0 + lane * 4 + i;
        v[i] = c < a.cols ? source_value(a, src_row, c) : 0.0f;
        if (c < a.cols) m = fmaxf(m, fabsf(v[i]));
      }
      const float scale = act_scale_of(warp_max(m));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t c = c0 + lane * 4 + i;
        if (c < a.cols) store_quantized(a, r, c, v[i], scale);
      }
      if (a.dst_q && lane == 0) *scale_slot(a, group, r, c0 / kBlock) = scale;
    }
    return;
  }
  const float scale = q.act_scale == ActScale::kStatic ? q.static_scale[group] : act_scale_of(*q.amax);
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    store_quantized(a, r, c, source_value(a, src_row, c), scale);
  }
  if (a.dst_q) {
    for (int64_t kb = threadIdx.x; kb * kBlock < a.cols; kb += blockDim.x) *scale_slot(a, group, r, kb) = scale;
  }
}

// out[g][kb][nb] = the scale of block (nb, kb) of part `part` of W_g (per-tensor: the part's scale).
__global__ void expand_scales_kernel(QuantMethod method, const float* w_scale, int64_t part_rows, int64_t k,
                                     int64_t parts, int64_t part, float* out) {
  const int64_t g = blockIdx.x;
  const int64_t n_blocks = (part_rows + kBlock - 1) / kBlock, k_blocks = (k + kBlock - 1) / kBlock;
  for (int64_t i = threadIdx.x; i < n_blocks * k_blocks; i += blockDim.x) {
    const int64_t kb = i / n_blocks, nb = i % n_blocks;
    const float s = method == QuantMethod::kFp8Block128
                        ? w_scale[((g * parts + part) * n_blocks + nb) * k_blocks + kb]
                        : w_scale[g * parts + part];
    out[(g * k_blocks + kb) * n_blocks + nb] = s;
  }
}

// One warp per (group, weight row n). Each lane takes 16 consecutive K values
// per step (one 16-byte weight load; 16 divides 128, so one scale per load),
// the warp 512; the row's weights are read once per tile of kRowTile group
// rows, whose sums are kept side by side. Deterministic: every output is one
// lane-sequential fp32 FMA chain per lane, then a fixed xor-shuffle tree.
constexpr int kRowTile = 8;
constexpr int kLaneK = 16;

__global__ void gemm_kernel(Fp8GemmArgs a) {
  if (static_cast<int>(blockIdx.y) >= *a.num_active) return;
  const int64_t g = a.active_groups[blockIdx.y];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = a.group_rows[g];
  if (n >= a.n || rows == 0) return;
  const int64_t r0 = a.group_start[g];
  const int64_t part_rows = a.n / a.parts, part = n / part_rows;
  const int64_t row_blocks = (part_rows + kBlock - 1) / kBlock, col_blocks = (a.k + kBlock - 1) / kBlock;
  const uint8_t* w = a.w + (g * a.n + n) * a.k;
  const bool block = a.method == QuantMethod::kFp8Block128;
  const float* scale_row = block ? a.w_scale + ((g * a.parts + part) * row_blocks + (n % part_rows) / kBlock) * col_blocks
                                 : a.w_scale + g * a.parts + part;
  for (int64_t rt = 0; rt < rows; rt += kRowTile) {
    const int nr = static_cast<int>(rows - rt < kRowTile ? rows - rt : kRowTile);
    float acc[kRowTile];
#pragma unroll
    for (int i = 0; i < kRowTile; ++i) acc[i] = 0.0f;
    // NOTE: K is a multiple of 16 (kSm90DimAlignment), so a lane's 16 values never cross K.
    for (int64_t k0 = static_cast<int64_t>(lane) * kLaneK; k0 < a.k; k0 += 32 * kLaneK) {
      const uint4 packed = *reinterpret_cast<const uint4*>(w + k0);
      const uint8_t* q = reinterpret_cast<const uint8_t*>(&packed);
      const float s = block ? scale_row[k0 / kBlock] : scale_row[0];
      float wv[kLaneK];
#pragma unroll
      for (int i = 0; i < kLaneK; ++i) wv[i] = __fmul_rn(e4m3_value(q[i]), s);
#pragma unroll
      for (int rr = 0; rr < kRowTile; ++rr) {
        if (rr >= nr) break;
        const float4* x = reinterpret_cast<const float4*>(a.a + (r0 + rt + rr) * a.k + k0);
#pragma unroll
        for (int v = 0; v < kLaneK / 4; ++v) {
          const float4 xv = x[v];
          acc[rr] = fmaf(xv.x, wv[4 * v], acc[rr]);
          acc[rr] = fmaf(xv.y, wv[4 * v + 1], acc[rr]);
          acc[rr] = fmaf(xv.z, wv[4 * v + 2], acc[rr]);
          acc[rr] = fmaf(xv.w, wv[4 * v + 3], acc[rr]);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRowTile; ++rr) {
      const float sum = warp_sum(acc[rr]);  // every lane takes part, whatever nr is
      if (lane == 0 && rr < nr) a.c[(r0 + rt + rr) * a.n + n] = sum;
    }
  }
}

__global__ void active_groups_kernel(const int32_t* rows, int64_t E, int32_t* active, int32_t* count) {
  const int lane = threadIdx.x;
  int total = 0;
  for (int64_t g0 = 0; g0 < E; g0 += 32) {
    const int64_t g = g0 + lane;
    const bool has = g < E && rows[g] > 0;
    const unsigned mask = __ballot_sync(0xffffffffu, has);
    if (has) active[total + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(g);
    total += __popc(mask);
  }
  if (lane == 0) *count = total;
}

__global__ void finalize_kernel(Fp8FinalizeArgs a) {
  const int64_t t = blockIdx.x, k = a.top_k, H = a.hidden;
  uint16_t* const out = a.out;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = a.pair_row[t * k + j];
      if (row < 0) {
        acc = __int_as_float(0x7fc00000);
        continue;
      }
      const float* y = a.y + static_cast<int64_t>(row) * H + h;
      float v = y[0];
      for (int64_t s = 1; s < a.k_splits; ++s) v += y[s * a.split_stride];
      acc = fmaf(a.topk_weights[t * k + j], v, acc);
    }
    const __nv_bfloat16 b = __float2bfloat16_rn(acc);
    out[t * H + h] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

}  // namespace

Status fp8_quantize_rows(const Fp8QuantizeArgs& a, const Fp8ActQuant& q, cudaStream_t stream) {
  if (a.rows == 0) return Status::Ok();
  const bool dynamic_tensor = q.method == QuantMethod::kFp8PerTensor && q.act_scale == ActScale::kDynamic;
  if (dynamic_tensor) {
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(q.amax, 0, sizeof(float), stream));
    amax_kernel<<<static_cast<unsigned>(a.rows), kWarps * 32, 0, stream>>>(a, q.amax);
    MOEKIT_CUDA_CHECK_LAUNCH("fp8_amax");
  }
  quantize_kernel<<<static_cast<unsigned>(a.rows), kWarps * 32, 0, stream>>>(a, q);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_quantize");
  return Status::Ok();
}

Status fp8_expand_weight_scales(QuantMethod method, const float* w_scale, int64_t num_experts, int64_t n, int64_t k,
                                int64_t parts, int64_t part, float* out, cudaStream_t stream) {
  if (num_experts == 0) return Status::Ok();
  expand_scales_kernel<<<static_cast<unsigned>(num_experts), kWarps * 32, 0, stream>>>(method, w_scale, n / parts, k,
                                                                                       parts, part, out);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_expand_weight_scales");
  return Status::Ok();
}

Status fp8_grouped_gemm(const Fp8GemmArgs& a, cudaStream_t stream) {
  if (a.k % kLaneK != 0) {
    return InvalidArgument("fp8_grouped_gemm: K = " + std::to_string(a.k) + " must be a multiple of " +
                           std::to_string(kLaneK));
  }
  if (a.max_active <= 0) return Status::Ok();
  const dim3 grid(static_cast<unsigned>((a.n + kWarps - 1) / kWarps), static_cast<unsigned>(a.max_active));
  gemm_kernel<<<grid, kWarps * 32, 0, stream>>>(a);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_grouped_gemm");
  return Status::Ok();
}

Status fp8_list_active_groups(const int32_t* group_rows, int64_t num_experts, int32_t* active, int32_t* count,
                              cudaStream_t stream) {
  active_groups_kernel<<<1, 32, 0, stream>>>(group_rows, num_experts, active, count);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_active_groups");
  return Status::Ok();
}

Status fp8_finalize(const Fp8FinalizeArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return Status::Ok();
  if (a.k_splits < 1) return InvalidArgument("fp8_finalize: k_splits must be at least 1");
  finalize_kernel<<<static_cast<unsigned>(a.num_tokens), kWarps * 32, 0, stream>>>(a);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_finalize");
  return Status::Ok();
}

}  // namespace moekit::cuda
