// Weight-streaming grouped GEMM for decode-size groups (a few to ~128 rows per
// expert), behind the grouped_gemm.h interface.
//
// With few rows per expert the layer is bound by reading the touched experts'
// weights once. So the roles are swapped: each CTA owns a slab of kRows weight
// rows (output columns) of one expert and streams it over K exactly once
// through a kStages-deep cp.async pipeline, while the expert's (gathered) token
// rows ride along as the narrow MMA operand. Every non-empty expert is cut into
// N / kRows slabs, so even one expert spreads over many SMs.
//
// MMA: mma.sync m16n8k16 bf16 -> fp32 with the weight slab as A (16 rows) and the
// token tile as B (8 tokens). A warp owns 32 weight rows = one gate/up block pair
// of the kGateUpBlock layout, so the gated epilogue pairs gate and up values
// that sit in the same thread's registers.
//
// Blocks: blockIdx.x = (j * n_slabs + slab) * k_splits + split, j = index among
// non-empty groups; blocks past the number of non-empty groups exit at once.
// With k_splits > 1 each block streams one K slice of its slab and writes fp32
// partial sums to its own slice of C (summed later in a fixed order, so the
// result does not depend on scheduling): that keeps every SM streaming when a
// few experts with long K would otherwise give fewer slabs than SMs. Groups with more
// rows than kTokens are done in several token tiles (the slab is re-read);
// within a tile only the n8 token tiles that hold tokens are loaded and
// multiplied, so a wide kTokens costs shared memory, not MMA work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_func_attr.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/grouped_gemm.h"

namespace moekit::cuda::sm90 {

template <int kWarps_, int kTokenTiles_, int kStages_, int kBlockK_>
struct StreamTraits {
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 32 * kWarps;         // weight rows (N) per CTA: one gate/up pair per warp
  static constexpr int kTokenTiles = kTokenTiles_;  // n8 MMA tiles per token tile
  static constexpr int kTokens = 8 * kTokenTiles;   // token rows per token tile
  static constexpr int kStages = kStages_;
  // bf16 per row per stage: a longer contiguous run per weight row per stage
  // (kBlockK * 2 bytes) keeps DRAM reads in long bursts.
  static constexpr int kBlockK = kBlockK_;
  static constexpr int kChunks = kBlockK / 8;
  static constexpr int kRowBytes = kBlockK * 2;
  static constexpr int kWStageBytes = kRows * kRowBytes;    // (kRows, kBlockK) bf16, swizzled
  static constexpr int kXStageBytes = kTokens * kRowBytes;  // (kTokens, kBlockK) bf16, swizzled
  static constexpr int kSmemBytes = kStages * (kWStageBytes + kXStageBytes);
  static_assert(kRows == 32 * kWarps && 2 * kGateUpBlock == 32, "a warp owns exactly one gate/up block pair");
  static_assert(kTokenTiles == 1 || kTokenTiles % 2 == 0, "token tiles are loaded in pairs (ldmatrix.x4)");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kBlockK % 64 == 0, "the swizzle needs at least 8 chunks per row");
  static_assert(kSmemBytes <= 200 * 1024, "stages must fit the 227 KB shared memory of an SM");
};

struct StreamParams {
  const __nv_bfloat16* a;      // [a_rows, K] bf16
  const int32_t* a_row_index;  // [max_rows] i32 or null (not gathered)
  const __nv_bfloat16* b;      // [G, N, K] bf16 (gated: kGateUpBlock layout)
  void* c;                     // [max_rows, n_out] bf16 | f32
  const int32_t* group_start;  // [G]
  const int32_t* group_rows;   // [G]
  int num_groups;
  int n, k, n_out;
  int n_slabs;                 // n / kRows
  int k_splits;                // K slices per slab (1: whole K)
  int max_group_rows;          // groups with more rows are left to another kernel (INT_MAX: none)
  int64_t c_split_stride;      // elements between the K slices' outputs (k_splits > 1)
  bool out_f32;
  bool activation;             // epilogue applies the activation
  bool gated;
  ActivationParams act;
};

namespace detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes == 0 writes zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 4-byte async copy global -> shared; src_bytes == 0 writes zeros.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// NOTE: e4m3 mma.sync exists from sm_89 on. The portable build also compiles
// its callers for sm_80, where the host never launches them (they need
// CudaTarget::kSm89); a launch there anyway traps rather than return zeros.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled (rows, kBlockK)
// stage: the chunk index is xor-ed with the row's low 3 bits, so the 8 rows an
// ldmatrix reads at one logical chunk land in 8 different bank groups.
template <class Tr>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * Tr::kRowBytes + ((chunk ^ (row & 7)) << 4);
}

// The j-th group g (ascending) of [0, num_groups) with taken(g), or -1 when
// there are fewer; every thread of the block calls it and gets the answer.
// Each thread counts a contiguous range of groups, a block scan places them.
template <int kThreads, class Taken>
__device__ __forceinline__ int nth_taken_group(int j, int num_groups, Taken taken) {
  __shared__ int32_t scan[kThreads];
  __shared__ int32_t s_group;
  const int tid = threadIdx.x;
  const int per = (num_groups + kThreads - 1) / kThreads;
  const int g_begin = min(num_groups, tid * per), g_end = min(num_groups, g_begin + per);
  int count = 0;
  for (int g = g_begin; g < g_end; ++g) count += taken(g) ? 1 : 0;
  if (tid == 0) s_group = -1;
  scan[tid] = count;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {  // inclusive scan
    const int v = tid >= off ? scan[tid - off] : 0;
    __syncthreads();
    scan[tid] += v;
    __syncthreads();
  }
  const int before = scan[tid] - count;
  if (j >= before && j < before + count) {
    int seen = before;
    for (int g = g_begin; g < g_end; ++g) {
      if (taken(g)) {
        if (seen == j) s_group = g;
        ++seen;
      }
    }
  }
  __syncthreads();
  return s_group;
}

__device__ __forceinline__ void store_out(void* c, bool f32, int64_t i, float v) {
  if (f32) {
    static_cast<float*>(c)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(c)[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace detail

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) streaming_gemm_kernel(const StreamParams p) {
  using namespace detail;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* w_smem = smem;                                // (kStages, kRows, kBlockK) bf16
  uint8_t* x_smem = smem + Tr::kStages * Tr::kWStageBytes;  // (kStages, kTokens, kBlockK) bf16
  __shared__ int32_t token_src[Tr::kTokens];             // A row of each token of the tile, -1 = none

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x % p.k_splits;
  const int j = blockIdx.x / p.k_splits / p.n_slabs;
  const int slab = blockIdx.x / p.k_splits % p.n_slabs;

  // ---- Which group: the j-th non-empty one.
  auto taken = [&](int g) { return p.group_rows[g] > 0 && p.group_rows[g] <= p.max_group_rows; };
  const int g = nth_taken_group<Tr::kThreads>(j, p.num_groups, taken);
  if (g < 0) return;  // more blocks than non-empty groups: nothing to do

  const int rows = p.group_rows[g];
  const int row0 = p.group_start[g];
  const int n0 = slab * Tr::kRows;
  const __nv_bfloat16* w_slab = p.b + (static_cast<int64_t>(g) * p.n + n0) * p.k;  // (kRows, K)
  const int all_k_tiles = p.k / Tr::kBlockK;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(all_k_tiles) * split / p.k_splits);
  const int k_tiles = static_cast<int>(static_cast<int64_t>(all_k_tiles) * (split + 1) / p.k_splits) - kt_begin;
  void* const c_out = p.k_splits > 1 ? static_cast<void*>(static_cast<float*>(p.c) + split * p.c_split_stride) : p.c;
  const uint32_t w_base = smem_addr(w_smem), x_base = smem_addr(x_smem);

  for (int t0 = 0; t0 < rows; t0 += Tr::kTokens) {
    const int tokens = min(Tr::kTokens, rows - t0);
    const int used_tiles = (tokens + 7) / 8;  // block-uniform: empty n8 tiles are skipped
    for (int i = tid; i < Tr::kTokens; i += Tr::kThreads) {
      const int r = row0 + t0 + i;
      token_src[i] = i < tokens ? (p.a_row_index ? p.a_row_index[r] : r) : -1;
    }
    __syncthreads();

    auto load_stage = [&](int stage, int kt) {
      const int k0 = (kt_begin + kt) * Tr::kBlockK;
      const uint32_t ws = w_base + stage * Tr::kWStageBytes;
#pragma unroll
      for (int i = tid; i < Tr::kRows * Tr::kChunks; i += Tr::kThreads) {
        const int r = i / Tr::kChunks, ch = i % Tr::kChunks;
        cp_async_16(ws + swz<Tr>(r, ch), w_slab + static_cast<int64_t>(r) * p.k + k0 + ch * 8, 16);
      }
      const uint32_t xs = x_base + stage * Tr::kXStageBytes;
      // Only the n8 tiles that hold a token are loaded (and multiplied below).
      for (int i = tid; i < used_tiles * 8 * Tr::kChunks; i += Tr::kThreads) {
        const int r = i / Tr::kChunks, ch = i % Tr::kChunks;
        const int src = token_src[r];
        const __nv_bfloat16* ptr = src >= 0 ? p.a + static_cast<int64_t>(src) * p.k + k0 + ch * 8 : p.a;
        cp_async_16(xs + swz<Tr>(r, ch), ptr, src >= 0 ? 16 : 0);
      }
    };

    float acc[2][Tr::kTokenTiles][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tr::kTokenTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

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

      const int stage = kt % Tr::kStages;
      const uint32_t ws = w_base + stage * Tr::kWStageBytes;
      const uint32_t xs = x_base + stage * Tr::kXStageBytes;
#pragma unroll
      for (int kk = 0; kk < Tr::kBlockK / 16; ++kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int r = warp * 32 + mt * 16 + (lane & 15);
          ldmatrix_x4(ws + swz<Tr>(r, kk * 2 + (lane >> 4)), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
        }
        uint32_t b[Tr::kTokenTiles][2];
        if constexpr (Tr::kTokenTiles == 1) {
          const int r = lane & 7;
          ldmatrix_x2(xs + swz<Tr>(r, kk * 2 + ((lane >> 3) & 1)), b[0][0], b[0][1]);
        } else {
#pragma unroll
          for (int np = 0; np < Tr::kTokenTiles / 2; ++np) {
            if (2 * np >= used_tiles) break;
            // A pair's second tile may be unused: its rows are stale and its results never stored.
            const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(xs + swz<Tr>(r, kk * 2 + ((lane >> 3) & 1)), b[2 * np][0], b[2 * np][1], b[2 * np + 1][0],
                        b[2 * np + 1][1]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
            if (nt < used_tiles) mma_bf16_16816(acc[mt][nt], a[mt], b[nt]);
          }
      }
    }
    cp_async_wait<0>();

    // ---- Epilogue. acc[mt][nt][i]: weight row warp*32 + mt*16 + lane/4 (+8 for i >= 2),
    // token nt*8 + 2*(lane%4) + (i & 1).
#pragma unroll
    for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
      if (nt >= used_tiles) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = nt * 8 + 2 * (lane & 3) + (i & 1);
        if (tok >= tokens) continue;
        const int64_t out_row = static_cast<int64_t>(row0 + t0 + tok) * p.n_out;
        const int m = (lane >> 2) + (i >= 2 ? 8 : 0);
        if (p.gated) {
          // NOTE: kGateUpBlock layout: this warp's rows are gate block (mt 0) and up block (mt 1)
          // of intermediate columns [16 * pair, 16 * pair + 16).
          const int pair = (n0 >> 5) + warp;
          const float v = gated_activation(p.act, acc[0][nt][i], acc[1][nt][i]);
          store_out(c_out, p.out_f32, out_row + pair * kGateUpBlock + m, v);
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float v = acc[mt][nt][i];
            if (p.activation) v = plain_activation(p.act, v);
            store_out(c_out, p.out_f32, out_row + n0 + warp * 32 + mt * 16 + m, v);
          }
        }
      }
    }
    __syncthreads();  // token_src and the stages are reused by the next token tile
  }
}

// Launches the kernel for traits Tr. The caller checked N % kRows == 0 and K % kBlockK == 0.
template <class Tr>
cudaError_t launch_streaming_gemm(const StreamParams& p, int max_nonempty_groups, cudaStream_t stream) {
  const cudaError_t e = ensure_kernel_smem(reinterpret_cast<const void*>(streaming_gemm_kernel<Tr>), Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  const int64_t blocks = static_cast<int64_t>(max_nonempty_groups) * p.n_slabs * p.k_splits;
  if (blocks == 0) return cudaSuccess;
  streaming_gemm_kernel<Tr><<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace moekit::cuda::sm90
