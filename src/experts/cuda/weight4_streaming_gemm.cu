// The 4-bit weight-streaming grouped GEMM (weight4_streaming_gemm.h).
//
// Shape of the kernel (as streaming_gemm.cuh, whose helpers it uses): each warp
// of a CTA (one or four) owns 32 weight rows of one expert (a gate/up block pair)
// and streams them over K once through a cp.async pipeline; the expert's gathered
// token rows, loaded once per CTA, ride along as the mma.sync m16n8k16 B operand.
// Each thread's copies are fixed for the CTA (rows, chunks, token rows), so a
// stage costs an add and a cp.async per 16 bytes.
//
// Unpacking without a dequantized copy: in a 32-column sub-block a row holds 16
// bytes, and lane t of a quad reads the 4 bytes [4t, 4t + 4) (columns 8t..8t+7)
// of each of its 4 rows, one 32-bit shared load each. Those 8 values become the
// 4 bf16 pairs of the A fragment for the sub-block's two k16 steps. Which
// columns pair up in a register is free as long as the B (token) fragment pairs
// the same columns: both schemes pair nibbles j and j+4 of the word (columns j,
// j+4), 16 bits apart, so one shift lines both up:
//   int4:  0x4300 | (nibble ^ 8) is the bf16 136 + v exactly (two's complement v);
//          one bf16 subtraction leaves v;
//   mxfp4: sign -> bit 15, exponent and mantissa bits -> bits 8..6 make the bf16
//          e2m1 * 2^-126 exactly (e2m1's subnormal 0.5 lands on bf16's subnormal
//          2^-127), and one bf16 multiply by 2^(code - 1) gives e2m1 * 2^(code - 127),
//          the weight itself, exactly (bf16 has f32's exponent range), for every
//          code <= 128 (scales <= 2; the layer's largest code is checked when the
//          weights are prepared). Larger codes multiply by 2^126 instead and
//          scale the group's f32 partial, as int4 does.
// int4 scales are f32: each scale group's f32 partial is scaled once. Every k16
// step stays within one scale group (groups are >= 32 columns).
#include "experts/cuda/weight4_streaming_gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/instance_names.h"
#include "experts/cuda/stream_k_splits.h"
#include "experts/cuda/streaming_gemm.cuh"

namespace moekit::cuda {
namespace {

using sm90::detail::cp_async_16;
using sm90::detail::cp_async_commit;
using sm90::detail::cp_async_wait;
using sm90::detail::mma_bf16_16816;
using sm90::detail::nth_taken_group;
using sm90::detail::smem_addr;
using sm90::detail::store_out;

constexpr int kRows = 32;  // weight rows per warp: one gate/up block pair
constexpr int kSubK = 32;  // columns per sub-block: 16 bytes of a row, two k16 steps

template <int kWarps_, int kTokenTiles_, int kStages_, int kBlockK_, int kMinBlocks_>
struct W4Traits {
  static constexpr int kWarps = kWarps_;            // warps per CTA, 32 weight rows each, sharing the token tile
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsCta = kRows * kWarps;
  static constexpr int kTokenTiles = kTokenTiles_;  // n8 MMA tiles per token tile
  static constexpr int kTokens = 8 * kTokenTiles;
  static constexpr int kStages = kStages_;
  static constexpr int kBlockK = kBlockK_;          // columns per stage
  static constexpr int kMinBlocks = kMinBlocks_;    // CTAs per SM the registers must allow (latency hiding)
  static constexpr int kSubs = kBlockK / kSubK;
  static constexpr int kWRowBytes = kBlockK / 2;    // packed bytes of a row per stage
  static constexpr int kWChunks = kWRowBytes / 16;
  static constexpr int kWStageBytes = kRowsCta * kWRowBytes;
  static constexpr int kXChunks = kBlockK / 8;      // 16-byte chunks of a bf16 token row per stage
  static constexpr int kXStageBytes = kTokens * kBlockK * 2;
  static constexpr int kSStageBytes = kRowsCta * kBlockK / kSubK * 4;  // at most one f32 per 32 columns per row
  static constexpr int kStageBytes = kWStageBytes + kXStageBytes + kSStageBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  // cp.async of 16 bytes per thread per stage: weights and token rows (whole multiples).
  static constexpr int kWLoads = kRowsCta * kWChunks / kThreads;
  static constexpr int kXLoads = (kTokens * kXChunks + kThreads - 1) / kThreads;
  static_assert(kBlockK == 128 || kBlockK == 256, "the weight swizzle is written for 4 or 8 chunks per row");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(2 * kGateUpBlock == kRows, "a warp owns exactly one gate/up block pair");
  static_assert(kThreads % kWChunks == 0 && kThreads % kXChunks == 0, "a thread keeps its chunk column");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024, "the CTAs the registers allow must fit in shared memory");

  // The swizzle of weight row `row`: the 8 rows of a quad-row load land in 8
  // different bank groups (the same for a lane's 4 rows, 8 apart).
  __device__ static int w_swizzle(int row) { return kWChunks == 4 ? (row >> 1) & 3 : row & 7; }
  __device__ static int w_off(int row, int ch) { return row * kWRowBytes + ((ch ^ w_swizzle(row)) << 4); }
  // Token rows: the two rows of a quarter-warp's 16-byte loads in different bank halves.
  __device__ static int x_off(int row, int ch) { return row * (kBlockK * 2) + ((ch ^ ((row & 1) << 2)) << 4); }
};

// kFold (mxfp4 with every code <= kMxfp4FoldMaxCode): the scale is multiplied
// into the bf16 weights; otherwise each scale group's f32 partial is scaled.
template <QuantMethod kMethod, bool kFold>
struct Scheme {
  static constexpr int kGroup = kMethod == QuantMethod::kInt4G128 ? 128 : 32;
  static constexpr int kScaleBytes = kMethod == QuantMethod::kMxfp4 ? 1 : 4;
  static constexpr bool kMx = kMethod == QuantMethod::kMxfp4;
  static_assert(!kFold || kMx, "only power-of-two scales fold into bf16 weights exactly");
};

struct W4Params {
  const __nv_bfloat16* a;
  const int32_t* a_row_index;
  const uint8_t* b;
  const uint8_t* b_scale;
  const float* bias;
  void* c;
  const int32_t* group_start;
  const int32_t* group_rows;
  int num_groups, n, k, n_out, n_slabs, k_splits;
  int64_t c_split_stride;
  bool out_f32, activation, gated;
  ActivationParams act;
};

// The e2m1 values of nibbles j and j + 4 of `w` as bf16 pairs scaled by 2^-126:
// out[j] = (e2m1(nibble j), e2m1(nibble j + 4)) * 2^-126, exactly (sign to bit
// 15, the 3 exponent and mantissa bits to bits 8..6 of each half).
__device__ __forceinline__ void e2m1_nibbles_to_bf16x2(uint32_t w, uint32_t (&out)[4]) {
  out[0] = ((w << 6) & 0x01C001C0u) | ((w << 12) & 0x80008000u);
  out[1] = ((w << 2) & 0x01C001C0u) | ((w << 8) & 0x80008000u);
  out[2] = ((w >> 2) & 0x01C001C0u) | ((w << 4) & 0x80008000u);
  out[3] = ((w >> 6) & 0x01C001C0u) | (w & 0x80008000u);
}

// int4 (two's complement nibbles) of `w` as bf16 pairs: out[j] = (v(nibble j), v(nibble j + 4)).
__device__ __forceinline__ void int4_nibbles_to_bf16x2(uint32_t w, uint32_t (&out)[4]) {
  // nibble ^ 8 is u = v + 8 in [0, 16); bf16 0x4300 | u is 128 + u exactly, so
  // subtracting 136 leaves v. The xor with 0x4308 does both in one step.
  const __nv_bfloat162 bias = __floats2bfloat162_rn(136.0f, 136.0f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t biased = ((w >> (4 * j)) & 0x000F000Fu) ^ 0x43084308u;
    const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), bias);
    out[j] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// 2^126 in both halves of a bf16 pair: turns e2m1_nibbles_to_bf16x2's values into the e2m1 values.
constexpr uint32_t kBf16x2Pow2_126 = 0x7E807E80u;

// The 4 scales of a lane's rows (quad_row + 8 i, i = 0..3, of its warp's 32) in
// the stage's scale group q, [groups][rows of the CTA]: the prepared layout stores
// each 32-row block's row r at (r % 8) * 4 + r / 8 (weight4_scale_position), so
// they are one 4- or 16-byte load at `lane_at` = 32 * warp + 4 * quad_row.
template <class S, class Tr>
__device__ __forceinline__ void lane_scales(const uint8_t* s_stage, int q, int lane_at, uint32_t& codes,
                                            float (&f)[4]) {
  if constexpr (S::kMx) {
    codes = *reinterpret_cast<const uint32_t*>(s_stage + q * Tr::kRowsCta + lane_at);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t c = (codes >> (8 * i)) & 0xFFu;
      f[i] = c == 0 ? 0x1p-127f : __uint_as_float(c << 23);  // 2^(c - 127); 255 never reaches the GPU
    }
  } else {
    const float4 v = *reinterpret_cast<const float4*>(s_stage + (q * Tr::kRowsCta + lane_at) * 4);
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
}

// bf16 pair of 2^(code - 1) for E8M0 byte i of `codes` (code <= 128): the
// exponent field code + 126 in both halves.
__device__ __forceinline__ uint32_t fold_multiplier(uint32_t codes, int i) {
  const uint32_t c = (codes >> (8 * i)) & 0xFFu;
  return c * 0x00800080u + 0x3F003F00u;
}

template <class Tr, QuantMethod kMethod, bool kFold>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) w4_streaming_kernel(const W4Params p) {
  using S = Scheme<kMethod, kFold>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int32_t token_src[Tr::kTokens];  // A row of each token of the tile, -1 = none

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad_row = lane >> 2, t = lane & 3;
  const int split = blockIdx.x % p.k_splits;
  const int j = blockIdx.x / p.k_splits / p.n_slabs;
  const int slab = blockIdx.x / p.k_splits % p.n_slabs;
  auto taken = [&](int gr) { return p.group_rows[gr] > 0; };
  const int g = nth_taken_group<Tr::kThreads>(j, p.num_groups, taken);
  if (g < 0) return;

  const int rows = p.group_rows[g];
  const int row0 = p.group_start[g];
  const int n0 = slab * Tr::kRowsCta;
  const int cta_rows = min(Tr::kRowsCta, p.n - n0);  // a multiple of 32: warps past it only keep the barriers
  const bool warp_active = warp * kRows < cta_rows;
  const int kb = p.k / 2;  // packed bytes per weight row
  const uint8_t* w_slab = p.b + (static_cast<int64_t>(g) * p.n + n0) * kb;
  const int64_t scale_row_bytes = static_cast<int64_t>(p.n) * S::kScaleBytes;  // one scale group's row of b_scale
  const uint8_t* s_slab = p.b_scale + static_cast<int64_t>(g) * (p.k / S::kGroup) * scale_row_bytes + n0 * S::kScaleBytes;
  const int all_k_tiles = (p.k + Tr::kBlockK - 1) / Tr::kBlockK;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(all_k_tiles) * split / p.k_splits);
  const int k_tiles = static_cast<int>(static_cast<int64_t>(all_k_tiles) * (split + 1) / p.k_splits) - kt_begin;
  void* const c_out = p.k_splits > 1 ? static_cast<void*>(static_cast<float*>(p.c) + split * p.c_split_stride) : p.c;
  const uint32_t smem_base = smem_addr(smem);

  // What this thread copies each stage, fixed for the CTA: weight chunks
  // (row w_row0 + i * kThreads / kWChunks, chunk w_ch), token chunks likewise, and
  // (for the first threads) one 16-byte piece of the scales.
  const int w_ch = tid % Tr::kWChunks, w_row0 = tid / Tr::kWChunks;
  const int x_ch = tid % Tr::kXChunks, x_row0 = tid / Tr::kXChunks;
  constexpr int kWRowStep = Tr::kThreads / Tr::kWChunks, kXRowStep = Tr::kThreads / Tr::kXChunks;
  constexpr int kSPiecesPerGroup = Tr::kRowsCta * S::kScaleBytes / 16;
  constexpr int kSPieces = Tr::kBlockK / S::kGroup * kSPiecesPerGroup;
  static_assert(kSPieces <= Tr::kThreads, "one scale piece per thread at most");
  const int s_q = tid / kSPiecesPerGroup, s_piece = tid % kSPiecesPerGroup;
  const bool s_loads = tid < kSPieces && s_piece * 16 / S::kScaleBytes < cta_rows;

  // Reading: this lane's rows (mt, h) of its warp are w_lane + (16 mt + 8 h) rows, all with one swizzle.
  const int lane_row = warp * kRows + quad_row;
  const int w_lane = lane_row * Tr::kWRowBytes + 4 * t, w_sw = Tr::w_swizzle(lane_row);
  const int x_sw = (quad_row & 1) << 2;

  for (int t0 = 0; t0 < rows; t0 += Tr::kTokens) {
    const int tokens = min(Tr::kTokens, rows - t0);
    const int used_tiles = (tokens + 7) / 8;
    for (int i = tid; i < Tr::kTokens; i += Tr::kThreads) {
      const int r = row0 + t0 + i;
      token_src[i] = i < tokens ? (p.a_row_index ? p.a_row_index[r] : r) : -1;
    }
    __syncthreads();
    const __nv_bfloat16* x_src[Tr::kXLoads];  // each loaded token row's first column, or null
#pragma unroll
    for (int i = 0; i < Tr::kXLoads; ++i) {
      const int r = x_row0 + i * kXRowStep;
      const int src = r < used_tiles * 8 ? token_src[r] : -1;
      x_src[i] = src >= 0 ? p.a + static_cast<int64_t>(src) * p.k + x_ch * 8 : nullptr;
    }

    auto load_stage = [&](int stage, int kt) {
      const int k0 = (kt_begin + kt) * Tr::kBlockK;
      const int k_valid = min(Tr::kBlockK, p.k - k0);  // a multiple of the scale group
      const uint32_t ws = smem_base + stage * Tr::kStageBytes;
      const uint32_t xs = ws + Tr::kWStageBytes, ss = xs + Tr::kXStageBytes;
      if (w_ch * kSubK < k_valid) {
        const uint8_t* src = w_slab + k0 / 2 + w_ch * 16;
#pragma unroll
        for (int i = 0; i < Tr::kWLoads; ++i) {
          const int r = w_row0 + i * kWRowStep;
          if (r < cta_rows) cp_async_16(ws + Tr::w_off(r, w_ch), src + static_cast<int64_t>(r) * kb, 16);
        }
      }
      if (x_ch * 8 < k_valid) {
#pragma unroll
        for (int i = 0; i < Tr::kXLoads; ++i) {
          const int r = x_row0 + i * kXRowStep;
          // Rows of used n8 tiles without a token are zero-filled (their products are never stored).
          if (r < used_tiles * 8) cp_async_16(xs + Tr::x_off(r, x_ch), x_src[i] ? x_src[i] + k0 : p.a, x_src[i] ? 16 : 0);
        }
      }
      if (s_loads && s_q * S::kGroup < k_valid) {
        cp_async_16(ss + tid * 16, s_slab + (k0 / S::kGroup + s_q) * scale_row_bytes + s_piece * 16, 16);
      }
    };

    float acc[2][Tr::kTokenTiles][4], part[2][Tr::kTokenTiles][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tr::kTokenTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = part[mt][nt][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<Tr::kStages - 2>();
      __syncthreads();  // stage kt landed for every thread; stage kt-1 is no longer read
      const int next = kt + Tr::kStages - 1;
      if (next < k_tiles) load_stage(next % Tr::kStages, next);
      cp_async_commit();
      if (!warp_active) continue;

      const int stage = kt % Tr::kStages;
      const uint8_t* w_st = smem + stage * Tr::kStageBytes;
      const uint8_t* x_st = w_st + Tr::kWStageBytes;
      const uint8_t* s_st = x_st + Tr::kXStageBytes;
      const int subs = min(Tr::kBlockK, p.k - (kt_begin + kt) * Tr::kBlockK) / kSubK;
#pragma unroll
      for (int sub = 0; sub < Tr::kSubs; ++sub) {
        if (sub >= subs) break;
        constexpr int kSubsPerGroup = S::kGroup / kSubK;
        const bool group_ends = sub % kSubsPerGroup == kSubsPerGroup - 1;
        uint32_t codes = 0;
        float scale[4];
        if (kFold || group_ends) lane_scales<S, Tr>(s_st, sub / kSubsPerGroup, warp * kRows + 4 * quad_row, codes, scale);
        // A: the 4 rows of this lane (mt, +8), 8 values each, as the two k16 steps' fragments.
        const uint8_t* w_sub = w_st + w_lane + ((sub ^ w_sw) << 4);
        uint32_t a[2][2][4];  // [k step][mt][fragment register]
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t w = *reinterpret_cast<const uint32_t*>(w_sub + (16 * mt + 8 * h) * Tr::kWRowBytes);
            uint32_t v[4];
            if constexpr (S::kMx) {
              e2m1_nibbles_to_bf16x2(w, v);
              // 2^(code - 1) folds the scale in; 2^126 alone restores the e2m1 value.
              const uint32_t m = kFold ? fold_multiplier(codes, 2 * mt + h) : kBf16x2Pow2_126;
#pragma unroll
              for (int jj = 0; jj < 4; ++jj) v[jj] = bf16x2_mul(v[jj], m);
            } else {
              int4_nibbles_to_bf16x2(w, v);
            }
            // v[0], v[1] -> k step 0 (k 2t.., k 2t+8..); v[2], v[3] -> k step 1.
            a[0][mt][h] = v[0];
            a[0][mt][2 + h] = v[1];
            a[1][mt][h] = v[2];
            a[1][mt][2 + h] = v[3];
          }
        }
#pragma unroll
        for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
          if (nt >= used_tiles) break;
          // Columns 8t..8t+7 of token row nt*8 + quad_row (x_off with its row's swizzle).
          const uint4 x = *reinterpret_cast<const uint4*>(x_st + (nt * 8 + quad_row) * (Tr::kBlockK * 2) +
                                                          (((sub * 4 + t) ^ x_sw) << 4));
          // (column j, column j + 4), as the A registers pair them.
          const uint32_t b[2][2] = {{__byte_perm(x.x, x.z, 0x5410), __byte_perm(x.x, x.z, 0x7632)},
                                    {__byte_perm(x.y, x.w, 0x5410), __byte_perm(x.y, x.w, 0x7632)}};
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float(&d)[4] = kFold ? acc[mt][nt] : part[mt][nt];
            mma_bf16_16816(d, a[0][mt], b[0]);
            mma_bf16_16816(d, a[1][mt], b[1]);
          }
        }
        if (!kFold && group_ends) {  // the scale group ends: scale its partial once
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
              for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                  float& pp = part[mt][nt][2 * h + c];
                  acc[mt][nt][2 * h + c] = fmaf(pp, scale[2 * mt + h], acc[mt][nt][2 * h + c]);
                  pp = 0.0f;
                }
              }
            }
          }
        }
      }
    }
    cp_async_wait<0>();

    // ---- Epilogue. acc[mt][nt][i]: weight row n0w + mt*16 + lane/4 (+8 for i >= 2),
    // token nt*8 + 2*(lane%4) + (i & 1).
    if (warp_active) {
      const int n0w = n0 + warp * kRows;
      const float* bias = p.bias ? p.bias + static_cast<int64_t>(g) * p.n + n0w : nullptr;
#pragma unroll
      for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
        if (nt >= used_tiles) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = nt * 8 + 2 * t + (i & 1);
          if (tok >= tokens) continue;
          const int64_t out_row = static_cast<int64_t>(row0 + t0 + tok) * p.n_out;
          const int m = quad_row + (i >= 2 ? 8 : 0);
          float v0 = acc[0][nt][i], v1 = acc[1][nt][i];
          if (bias) {
            v0 += bias[m];
            v1 += bias[16 + m];
          }
          if (p.gated) {  // kGateUpBlock layout: gate rows (mt 0) and up rows (mt 1) of 16 intermediate columns
            store_out(c_out, p.out_f32, out_row + (n0w >> 1) + m, gated_activation(p.act, v0, v1));
          } else {
            if (p.activation) {
              v0 = plain_activation(p.act, v0);
              v1 = plain_activation(p.act, v1);
            }
            store_out(c_out, p.out_f32, out_row + n0w + m, v0);
            store_out(c_out, p.out_f32, out_row + n0w + 16 + m, v1);
          }
        }
      }
    }
    __syncthreads();  // token_src and the stages are reused by the next token tile
  }
}

//                           warps  n8 tiles  stages  K per stage  CTAs per SM
using W1T8K128S3 = W4Traits<1, 1, 3, 128, 12>;  // 3 x (2 + 2 + 0.5) KB
using W4T8K128S3 = W4Traits<4, 1, 3, 128, 4>;   // 3 x (8 + 2 + 2) KB
using W4T16K128S3 = W4Traits<4, 2, 3, 128, 4>;  // 3 x (8 + 4 + 2) KB
using W4T32K128S3 = W4Traits<4, 4, 3, 128, 3>;  // 3 x (8 + 8 + 2) KB
using W4T64K128S3 = W4Traits<4, 8, 3, 128, 2>;  // 3 x (8 + 16 + 2) KB

template <class F>
auto with_traits(W4StreamVariant v, F&& f) {
  switch (v) {
    case W4StreamVariant::kW1T8K128S3: return f(W1T8K128S3{});
    case W4StreamVariant::kW4T8K128S3: return f(W4T8K128S3{});
    case W4StreamVariant::kW4T16K128S3: return f(W4T16K128S3{});
    case W4StreamVariant::kW4T32K128S3: return f(W4T32K128S3{});
    case W4StreamVariant::kW4T64K128S3: return f(W4T64K128S3{});
  }
  return f(W4T8K128S3{});
}

template <class Tr, QuantMethod kMethod, bool kFold = false>
cudaError_t launch(const W4Params& p, int64_t blocks, cudaStream_t stream) {
  const auto* kernel = reinterpret_cast<const void*>(w4_streaming_kernel<Tr, kMethod, kFold>);
  const cudaError_t e = ensure_kernel_smem(kernel, Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  w4_streaming_kernel<Tr, kMethod, kFold><<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

const char* w4_stream_variant_name(W4StreamVariant v) {
  return kSm90W4StreamNames[static_cast<size_t>(v)];  // in the enum's order (core/kernel_instances.h)
}

std::optional<W4StreamVariant> parse_w4_stream_variant(std::string_view name) {
  return parse_instance_name(kAllW4StreamVariants, &w4_stream_variant_name, name);
}

int64_t w4_streaming_k_splits(const W4StreamGemm& g, W4StreamVariant v, int sm_count) {
  if (g.activation || g.bias != nullptr || g.max_rows == 0) return 1;
  return with_traits(v, [&](auto tr) {
    using Tr = decltype(tr);
    StreamKSplitRule r;
    r.ctas = std::min(g.num_groups, g.max_rows) * ((g.n + Tr::kRowsCta - 1) / Tr::kRowsCta);
    r.smem_per_cta = Tr::kSmemBytes;
    r.max_ctas_per_sm = 24;  // as measured (bench/results/h200_v11): shared memory sets the slots
    r.k_steps = (g.k + Tr::kBlockK - 1) / Tr::kBlockK;
    r.waves = 2;
    r.max_splits = kMaxW4StreamKSplits;
    return stream_k_splits(r, sm_count);
  });
}

Status w4_streaming_gemm_check(const W4StreamGemm& g) {
  if (quant_family(g.method) != QuantFamily::kWeight4) {
    return InvalidArgument(std::string("4-bit streaming GEMM: quant ") + quant_method_name(g.method) + " is not 4-bit");
  }
  const int64_t group = weight4_group(g.method);
  if (g.n % kRows != 0) return InvalidArgument("4-bit streaming GEMM: N=" + std::to_string(g.n) + " is not a multiple of 32");
  if (g.k <= 0 || g.k % group != 0) {
    return InvalidArgument("4-bit streaming GEMM: K=" + std::to_string(g.k) + " is not a multiple of the scale group " +
                           std::to_string(group));
  }
  if (g.num_groups < 1 || g.max_rows > INT32_MAX / 2 || g.n > INT32_MAX / 2 || g.k > INT32_MAX / 2) {
    return InvalidArgument("4-bit streaming GEMM: sizes exceed int32 indexing");
  }
  if (g.k_splits < 1 || g.k_splits > kMaxW4StreamKSplits) {
    return InvalidArgument("4-bit streaming GEMM: " + std::to_string(g.k_splits) + " K slices");
  }
  if (g.k_splits > 1 && (g.activation || g.bias != nullptr || !g.out_f32)) {
    return InvalidArgument("4-bit streaming GEMM: K slices need an f32 partial output without an epilogue");
  }
  return Status::Ok();
}

Status w4_streaming_gemm(const W4StreamGemm& g, W4StreamVariant v, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(w4_streaming_gemm_check(g));
  if (g.max_rows == 0) return Status::Ok();
  W4Params p{};
  p.a = reinterpret_cast<const __nv_bfloat16*>(g.a);
  p.a_row_index = g.a_row_index;
  p.b = g.b;
  p.b_scale = static_cast<const uint8_t*>(g.b_scale);
  p.bias = g.bias;
  p.c = g.c;
  p.group_start = g.group_start;
  p.group_rows = g.group_rows;
  p.num_groups = static_cast<int>(g.num_groups);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.n_out = static_cast<int>(g.n_out());
  const int rows_cta = with_traits(v, [](auto tr) { return decltype(tr)::kRowsCta; });
  p.n_slabs = (p.n + rows_cta - 1) / rows_cta;
  p.k_splits = static_cast<int>(g.k_splits);
  p.c_split_stride = g.c_split_stride;
  p.out_f32 = g.out_f32;
  p.activation = g.activation;
  p.gated = g.activation && g.act.gated();
  p.act = ActivationParams{g.act.kind, g.act.swiglu_limit, g.act.swiglu_alpha};
  // Each non-empty group holds at least one row: at most min(G, max_rows) of them.
  const int64_t blocks = std::min(g.num_groups, g.max_rows) * p.n_slabs * p.k_splits;
  const cudaError_t e = with_traits(v, [&](auto tr) {
    using Tr = decltype(tr);
    switch (g.method) {
      case QuantMethod::kMxfp4:
        return g.mxfp4_max_code <= kMxfp4FoldMaxCode ? launch<Tr, QuantMethod::kMxfp4, true>(p, blocks, stream)
                                                     : launch<Tr, QuantMethod::kMxfp4, false>(p, blocks, stream);
      case QuantMethod::kInt4G32: return launch<Tr, QuantMethod::kInt4G32>(p, blocks, stream);
      default: return launch<Tr, QuantMethod::kInt4G128>(p, blocks, stream);
    }
  });
  MOEKIT_CUDA_CHECK(e);
  return Status::Ok();
}

}  // namespace moekit::cuda
