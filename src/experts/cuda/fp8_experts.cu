// The fp8 expert stages: see fp8_experts.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
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
__device__ __forceinline__ __nv_fp8_storage_t quantize(float x, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}
// The scale of (row r of group g, column block kb) where Fp8GemmLaunch::a_scale reads it.
__device__ __forceinline__ float* group_scale_slot(float* scales, const int32_t* group_start,
                                                   const int32_t* group_rows, int64_t cols, int g, int64_t r,
                                                   int64_t kb) {
  const int64_t start = group_start[g], k_blocks = (cols + kBlock - 1) / kBlock;
  return scales + start * k_blocks + kb * group_rows[g] + (r - start);
}
__device__ __forceinline__ float* scale_slot(const Fp8QuantizeArgs& a, int g, int64_t r, int64_t kb) {
  if (a.scales_by_row) return a.dst_scale + r * ((a.cols + kBlock - 1) / kBlock) + kb;
  return group_scale_slot(a.dst_scale, a.group_start, a.group_rows, a.cols, g, r, kb);
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The group (expert) of permuted row r, or -1 when r lies in none. Starts
// ascend with g (an empty group starts where the next one does), so the last
// group starting at or before r is the only one that can hold it. Every lane
// of a warp may ask for the same row: the loads are broadcasts.
__device__ __forceinline__ int group_of(int64_t r, const int32_t* start, const int32_t* rows, int64_t E) {
  if (E <= 0) return -1;
  int64_t lo = 0, hi = E;  // the answer lies in [lo, hi) once start[lo] <= r
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (start[mid] <= r) lo = mid; else hi = mid;
  }
  return r >= start[lo] && r < static_cast<int64_t>(start[lo]) + rows[lo] ? static_cast<int>(lo) : -1;
}

// Quantizer work: one warp per (row, run of up to kBlocksPerItem 128-column
// blocks); lane l takes the 4 consecutive columns 4l.. of each block (cols is
// a multiple of 16, so the four are in or out together), with one vector load
// when `vector` says the source allows it (16-byte aligned f32 rows, 8-byte
// aligned bf16 rows). A run's loads are issued together, its row's group
// looked up once.
constexpr int kQuantWarps = 8;
constexpr int kLaneCols = 4;
constexpr int kBlocksPerItem = 4;
static_assert(32 * kLaneCols == kBlock, "a warp covers one 128-column block");

struct QuantItem {
  int64_t r = 0, kb0 = 0;  // permuted row, first column block of the run
  int group = -1;
  int64_t src_row = 0;
};
__device__ __forceinline__ int64_t quant_items(const Fp8QuantizeArgs& a) {
  const int64_t k_blocks = (a.cols + kBlock - 1) / kBlock;
  return a.rows * ((k_blocks + kBlocksPerItem - 1) / kBlocksPerItem);
}
__device__ __forceinline__ QuantItem quant_item(const Fp8QuantizeArgs& a, int64_t item) {
  QuantItem it;
  const int64_t k_blocks = (a.cols + kBlock - 1) / kBlock;
  const int64_t runs = (k_blocks + kBlocksPerItem - 1) / kBlocksPerItem;
  if (item >= a.rows * runs) return it;
  it.r = item / runs;
  it.kb0 = item % runs * kBlocksPerItem;
  it.group = a.group_start ? group_of(it.r, a.group_start, a.group_rows, a.num_experts) : 0;
  it.src_row = a.row_index ? a.row_index[it.r] : it.r;
  return it;
}
__device__ __forceinline__ int64_t lane_col(int64_t kb) { return kb * kBlock + (threadIdx.x % 32) * kLaneCols; }

__device__ __forceinline__ void load4_f32(const float* p, bool vector, float (&v)[4]) {
  if (vector) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = p[i];
  }
}
// Columns c..c+3 of source row src_row: the stored values, or the activation of GEMM1's outputs.
__device__ __forceinline__ void source_values(const Fp8QuantizeArgs& a, bool vector, int64_t src_row, int64_t c,
                                              float (&v)[4]) {
  if (!a.activation) {
    if (a.src_bf16) {
      const auto* p = reinterpret_cast<const __nv_bfloat16*>(a.src) + src_row * a.ld + c;
      if (vector) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&x.x);
        const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&x.y);
        v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(p[i]);
      }
    } else {
      load4_f32(static_cast<const float*>(a.src) + src_row * a.ld + c, vector, v);
    }
    return;
  }
  const float* row = static_cast<const float*>(a.src) + src_row * a.ld;
  with_activation(a.act.kind, [&](auto kind) {
    const ActivationParams p{kind, a.act.swiglu_limit, a.act.swiglu_alpha};
    float x[4], y[4];
    constexpr GateUpLayout layout = gate_up_layout(kind);
    if constexpr (layout == GateUpLayout::kSplit) {  // gate c.., up I + c..
      load4_f32(row + c, vector, x);
      load4_f32(row + a.cols + c, vector, y);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = gated_activation(p, x[i], y[i]);
    } else if constexpr (layout == GateUpLayout::kInterleaved) {  // gate 2c, up 2c + 1
      load4_f32(row + 2 * c, vector, x);
      load4_f32(row + 2 * c + 4, vector, y);
      v[0] = gated_activation(p, x[0], x[1]), v[1] = gated_activation(p, x[2], x[3]);
      v[2] = gated_activation(p, y[0], y[1]), v[3] = gated_activation(p, y[2], y[3]);
    } else {
      static_assert(layout == GateUpLayout::kNotGated);
      load4_f32(row + c, vector, x);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = plain_activation(p, x[i]);
    }
  });
}

// amax over the rows inside groups (max is order-free: any reduction order
// gives the same value). A grid-stride loop with one atomic per block: the
// atomics to one address serialize.
__global__ void amax_kernel(Fp8QuantizeArgs a, bool vector, float* amax) {
  __shared__ float block_max[kQuantWarps];
  const int64_t items = quant_items(a);
  float m = 0.0f;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32; item < items;
       item += static_cast<int64_t>(gridDim.x) * kQuantWarps) {
    const QuantItem it = quant_item(a, item);
    if (it.group < 0) continue;
    float v[kBlocksPerItem][4] = {};
#pragma unroll
    for (int u = 0; u < kBlocksPerItem; ++u) {
      if (lane_col(it.kb0 + u) < a.cols) source_values(a, vector, it.src_row, lane_col(it.kb0 + u), v[u]);
    }
#pragma unroll
    for (int u = 0; u < kBlocksPerItem; ++u)
#pragma unroll
      for (int i = 0; i < 4; ++i) m = fmaxf(m, fabsf(v[u][i]));
  }
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) block_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kQuantWarps; ++w) m = fmaxf(m, block_max[w]);
    // Non-negative floats order as their bit patterns.
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
  }
}

__global__ void quantize_kernel(Fp8QuantizeArgs a, Fp8ActQuant q, bool vector) {
  const QuantItem it = quant_item(a, static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32);
  if (it.group < 0) return;  // warp-uniform
  const int64_t k_blocks = (a.cols + kBlock - 1) / kBlock;
  float v[kBlocksPerItem][4] = {};
#pragma unroll
  for (int u = 0; u < kBlocksPerItem; ++u) {  // every load of the run first
    if (lane_col(it.kb0 + u) < a.cols) source_values(a, vector, it.src_row, lane_col(it.kb0 + u), v[u]);
  }
  const float tensor_scale = q.method == QuantMethod::kFp8Block128 ? 0.0f
                             : q.act_scale == ActScale::kStatic    ? q.static_scale[it.group]
                                                                   : act_scale_of(*q.amax);
#pragma unroll
  for (int u = 0; u < kBlocksPerItem; ++u) {
    const int64_t kb = it.kb0 + u;
    if (kb >= k_blocks) break;  // warp-uniform
    float scale = tensor_scale;
    if (q.method == QuantMethod::kFp8Block128) {
      const float m = fmaxf(fmaxf(fabsf(v[u][0]), fabsf(v[u][1])), fmaxf(fabsf(v[u][2]), fabsf(v[u][3])));
      scale = act_scale_of(warp_max(m));  // every lane takes part
    }
    const int64_t c = lane_col(kb);
    if (c < a.cols) {
      __nv_fp8_storage_t b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = quantize(v[u][i], scale);
      const int64_t at = it.r * a.cols + c;
      *reinterpret_cast<uint32_t*>(a.dst_q + at) =
          uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
    }
    if (threadIdx.x % 32 == 0) *scale_slot(a, it.group, it.r, kb) = scale;
  }
}

// One warp per permuted row: 16 bytes per lane, then the row's scales.
__global__ void gather_kernel(Fp8GatherArgs a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
  if (r >= a.rows) return;
  const int g = group_of(r, a.group_start, a.group_rows, a.num_experts);
  if (g < 0) return;
  const int lane = threadIdx.x % 32;
  const int64_t src = a.row_index[r], k_blocks = (a.cols + kBlock - 1) / kBlock;
  const uint4* from = reinterpret_cast<const uint4*>(a.src_q + src * a.cols);
  uint4* to = reinterpret_cast<uint4*>(a.dst_q + r * a.cols);
  for (int64_t i = lane; i < a.cols / 16; i += 32) to[i] = from[i];
  for (int64_t kb = lane; kb < k_blocks; kb += 32) {
    *group_scale_slot(a.dst_scale, a.group_start, a.group_rows, a.cols, g, r, kb) = a.src_scale[src * k_blocks + kb];
  }
}

// out[g][kb][nb] = the scale of block (nb, kb) of part `part` of W_g (per-tensor:
// the part's scale); part < 0: the blocks of every part in turn (part_rows a
// multiple of 128, so no block straddles two parts).
__global__ void expand_scales_kernel(QuantMethod method, const float* w_scale, int64_t part_rows, int64_t k,
                                     int64_t parts, int64_t part, float* out) {
  const int64_t g = blockIdx.x;
  const int64_t part_blocks = (part_rows + kBlock - 1) / kBlock, k_blocks = (k + kBlock - 1) / kBlock;
  const int64_t n_blocks = part < 0 ? parts * part_blocks : part_blocks;
  for (int64_t i = threadIdx.x; i < n_blocks * k_blocks; i += blockDim.x) {
    const int64_t kb = i / n_blocks, nb = i % n_blocks;
    const int64_t p = part < 0 ? nb / part_blocks : part, pb = part < 0 ? nb % part_blocks : nb;
    const float s = method == QuantMethod::kFp8Block128 ? w_scale[((g * parts + p) * part_blocks + pb) * k_blocks + kb]
                                                        : w_scale[g * parts + p];
    out[(g * k_blocks + kb) * n_blocks + nb] = s;
  }
}

// One thread per 4 consecutive columns of one token (H is a multiple of 16):
// the token's k rows (and their K slices) are read as float4.
constexpr int kFinalizeCols = 4 * 32 * kWarps;
__global__ void finalize_kernel(Fp8FinalizeArgs a) {
  const int64_t col_blocks = (a.hidden + kFinalizeCols - 1) / kFinalizeCols;
  const int64_t t = blockIdx.x / col_blocks, k = a.top_k, H = a.hidden;
  const int64_t h = (blockIdx.x % col_blocks) * kFinalizeCols + threadIdx.x * 4;
  if (h >= H) return;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t j = 0; j < k; ++j) {
    const int32_t row = a.pair_row[t * k + j];
    if (row < 0) {
      if (a.skip_negative_ids && a.topk_ids[t * k + j] < 0) continue;  // computed on another rank
      for (float& x : acc) x = __int_as_float(0x7fc00000);
      continue;
    }
    const float* y = a.y + static_cast<int64_t>(row) * H + h;
    float4 v = *reinterpret_cast<const float4*>(y);
    for (int64_t s = 1; s < a.k_splits; ++s) {
      const float4 u = *reinterpret_cast<const float4*>(y + s * a.split_stride);
      v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    const float w = a.topk_weights[t * k + j];
    acc[0] = fmaf(w, v.x, acc[0]), acc[1] = fmaf(w, v.y, acc[1]);
    acc[2] = fmaf(w, v.z, acc[2]), acc[3] = fmaf(w, v.w, acc[3]);
  }
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[0], acc[1]), hi = __floats2bfloat162_rn(acc[2], acc[3]);
  uint16_t* const out = a.out + t * H + h;
  if (reinterpret_cast<uintptr_t>(a.out) % 8 == 0) {  // a caller's tensor may be a misaligned view
    *reinterpret_cast<uint2*>(out) = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else {
    const __nv_bfloat16 b[4] = {__low2bfloat16(lo), __high2bfloat16(lo), __low2bfloat16(hi), __high2bfloat16(hi)};
    for (int i = 0; i < 4; ++i) out[i] = *reinterpret_cast<const uint16_t*>(&b[i]);
  }
}

}  // namespace

Status fp8_quantize_rows(const Fp8QuantizeArgs& a, const Fp8ActQuant& q, cudaStream_t stream) {
  if (a.rows == 0) return Status::Ok();
  const int64_t k_blocks = (a.cols + kBlock - 1) / kBlock;
  const int64_t items = a.rows * ((k_blocks + kBlocksPerItem - 1) / kBlocksPerItem);  // as quant_items()
  // Vector loads need 16-byte aligned f32 rows (8-byte bf16 rows): the workspace's are; a caller's tensor may not be.
  const size_t row_bytes = static_cast<size_t>(a.ld) * (a.src_bf16 && !a.activation ? 2 : 4);
  const size_t need = a.src_bf16 && !a.activation ? 8 : 16;
  const bool vector = reinterpret_cast<uintptr_t>(a.src) % need == 0 && row_bytes % need == 0;
  const bool dynamic_tensor = q.method == QuantMethod::kFp8PerTensor && q.act_scale == ActScale::kDynamic;
  if (q.method == QuantMethod::kFp8PerTensor && q.act_scale == ActScale::kStatic && a.group_start == nullptr) {
    return InvalidArgument("fp8_quantize_rows: static per-expert scales need the rows' groups");
  }
  if (a.dst_q == nullptr || a.dst_scale == nullptr) return InvalidArgument("fp8_quantize_rows: no output");
  if (!a.scales_by_row && a.group_start == nullptr) {
    return InvalidArgument("fp8_quantize_rows: the tensor-core scale layout needs the rows' groups");
  }
  if (dynamic_tensor) {
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(q.amax, 0, sizeof(float), stream));
    constexpr int64_t kAmaxBlocks = 1024;
    const int64_t blocks = std::min(kAmaxBlocks, (items + kQuantWarps - 1) / kQuantWarps);
    amax_kernel<<<static_cast<unsigned>(blocks), kQuantWarps * 32, 0, stream>>>(a, vector, q.amax);
    MOEKIT_CUDA_CHECK_LAUNCH("fp8_amax");
  }
  if ((items + kQuantWarps - 1) / kQuantWarps > INT32_MAX) return InvalidArgument("fp8_quantize_rows: too many rows");
  quantize_kernel<<<static_cast<unsigned>((items + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, stream>>>(
      a, q, vector);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_quantize");
  return Status::Ok();
}

Status fp8_gather_rows(const Fp8GatherArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return Status::Ok();
  if (a.cols % 16 != 0) return InvalidArgument("fp8_gather_rows: cols must be a multiple of 16");
  if ((a.rows + kQuantWarps - 1) / kQuantWarps > INT32_MAX) return InvalidArgument("fp8_gather_rows: too many rows");
  gather_kernel<<<static_cast<unsigned>((a.rows + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, stream>>>(a);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_gather_rows");
  return Status::Ok();
}

Status fp8_expand_weight_scales(QuantMethod method, const float* w_scale, int64_t num_experts, int64_t n, int64_t k,
                                int64_t parts, int64_t part, float* out, cudaStream_t stream) {
  if (num_experts == 0) return Status::Ok();
  if (part < 0 && parts > 1 && (n / parts) % kBlock != 0) {
    return InvalidArgument("fp8_expand_weight_scales: every part at once needs parts of whole 128-row blocks");
  }
  expand_scales_kernel<<<static_cast<unsigned>(num_experts), kWarps * 32, 0, stream>>>(method, w_scale, n / parts, k,
                                                                                       parts, part, out);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_expand_weight_scales");
  return Status::Ok();
}

Status fp8_finalize(const Fp8FinalizeArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return Status::Ok();
  if (a.k_splits < 1) return InvalidArgument("fp8_finalize: k_splits must be at least 1");
  if (a.hidden % 4 != 0) return InvalidArgument("fp8_finalize: H must be a multiple of 4");
  if (a.skip_negative_ids && a.topk_ids == nullptr) return InvalidArgument("fp8_finalize: skip_negative_ids needs the ids");
  const int64_t blocks = a.num_tokens * ((a.hidden + kFinalizeCols - 1) / kFinalizeCols);
  if (blocks > INT32_MAX) return InvalidArgument("fp8_finalize: too many tokens");
  finalize_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(a);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_finalize");
  return Status::Ok();
}

}  // namespace moekit::cuda
