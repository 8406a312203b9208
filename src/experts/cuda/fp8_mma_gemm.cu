// The fp8 tensor-core grouped GEMM on mma.sync (fp8_mma_gemm.h).
#include "experts/cuda/fp8_mma_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/block/block_scan.cuh>
#include <string>

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "experts/cuda/streaming_gemm.cuh"

namespace moekit::cuda {
namespace {

constexpr int kTileN = 128;
constexpr int kTileK = static_cast<int>(kFp8BlockSize);  // one scale block per K step
constexpr int kStages = 3;
constexpr int kThreads = 256;      // 8 warps
constexpr int kRowBytes = kTileK;  // e4m3: a byte per element
constexpr int kOperandBytesB = kTileN * kRowBytes;

// The two tiles: 128 x 128 (8 warps as 2 x 4, 64 x 32 outputs each) for
// groups of many rows, 32 x 128 (8 warps along N, 32 x 16 each) for groups of
// few, which the 128-row tile would pad with many times the work.
template <int kRows>
struct MmaTile {
  static_assert(kRows == 128 || kRows == 32);
  static constexpr int kM = kRows;
  static constexpr int kWarpsM = kRows == 128 ? 2 : 1, kWarpsN = 8 / kWarpsM;
  static constexpr int kWarpRows = kM / kWarpsM, kWarpCols = kTileN / kWarpsN;
  static constexpr int kMI = kWarpRows / 16, kNI = kWarpCols / 8;  // m16 and n8 fragments per warp
  static constexpr int kOperandBytesA = kM * kRowBytes;
  static constexpr int kStageBytes = kOperandBytesA + kOperandBytesB + kM * static_cast<int>(sizeof(float));
  // 128 rows: 99840 bytes, within the 99 KB of sm_86 and sm_89.
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kOperandBytesA / 16 % kThreads == 0 && kOperandBytesB / 16 % kThreads == 0,
                "each thread copies whole 16-byte chunks");
  static_assert(kNI % 2 == 0, "B fragments come two n8 tiles per ldmatrix.x4");
};

// Mean rows per group up to which the 32-row tile is taken. Measured on an H100
// with each tile forced, interleaved in one process (bench/results/h100_v18):
// at 64 rows the 32-row tile takes 0.86x the time (Mixtral-8x7B M = 256,
// Qwen3-30B-A3B M = 1024), at 128 rows 1.00-1.05x (DeepSeek-V3 and
// gpt-oss-120b-like M = 4096), at 256 and more 1.10-1.28x.
constexpr int64_t kSmallTileMaxRows = 64;

struct MTile {
  int32_t group, row0;  // rows [row0, row0 + tile rows) of group `group`
};
constexpr size_t kTableHeader = 256;  // the tile count, then the tiles

int64_t max_m_tiles(int64_t num_groups, int64_t max_rows, int tile_rows) {
  return max_rows / tile_rows + std::min(num_groups, max_rows);  // each group with rows adds one partial tile at most
}

// One block lists every group's tiles of `tile_rows` rows in group order.
__global__ void __launch_bounds__(kThreads) list_m_tiles(const int32_t* group_rows, int num_groups, int tile_rows,
                                                         int max_tiles, int32_t* count, MTile* tiles) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int per = (num_groups + kThreads - 1) / kThreads;
  const int g_begin = min(num_groups, static_cast<int>(threadIdx.x) * per), g_end = min(num_groups, g_begin + per);
  int mine = 0;
  for (int g = g_begin; g < g_end; ++g) mine += (max(group_rows[g], 0) + tile_rows - 1) / tile_rows;
  int next = 0, total = 0;
  Scan(temp).ExclusiveSum(mine, next, total);
  for (int g = g_begin; g < g_end; ++g) {
    for (int r = 0; r < group_rows[g]; r += tile_rows, ++next) {
      if (next < max_tiles) tiles[next] = MTile{g, r};
    }
  }
  if (threadIdx.x == 0) *count = min(total, max_tiles);
}

struct Params {
  const uint8_t* a;
  const float* a_scale;
  const uint8_t* b;
  int64_t b_group_stride;
  const float* b_scale;
  float* d;
  int ldd;
  const int32_t* group_start;
  const int32_t* group_rows;
  int n, k;
  const int32_t* tile_count;
  const MTile* tiles;
};

// Two e4m3 bytes, each in the low byte of a 16-bit half, as two f16 that are
// 2^-8 of their values: sign to bit 15, exponent and mantissa bits straight
// below it (e4m3's bias 7 against f16's 15; subnormals map onto subnormals).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t halves) {
  return ((halves & 0x00800080u) << 8) | ((halves & 0x007f007fu) << 7);
}
// The four e4m3 of `x` (byte i = element i) as f16 pairs: lo = elements 0, 1; hi = 2, 3.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_f16x2(__byte_perm(x, 0, 0x4140));
  hi = e4m3x2_to_f16x2(__byte_perm(x, 0, 0x4342));
}
// The kF16 products carry 2^-8 from each operand.
template <Fp8MmaOperands kOps>
constexpr float kProductScale = kOps == Fp8MmaOperands::kF16 ? 65536.0f : 1.0f;

// Fragments of one 32-byte K step (two 16-byte chunks) from ldmatrix.x4 on the
// swizzled byte rows: each thread holds 4 consecutive e4m3 of a row per
// register. a[mi] = {rows g, g + 8} x {chunk 0, 1} of m16 tile mi (the e4m3
// m16n8k32 A operand as it is); b[ni] = col g x {chunk 0, 1} of n8 tile ni.
// The f16 MMA (k16) takes one chunk each: with lo/hi halves as its k pairs,
// A and B permute K the same way, so the dot products are unchanged.
template <Fp8MmaOperands kOps, int MI, int NI>
__device__ __forceinline__ void mma_k32(float (&part)[MI][NI][4], const uint32_t (&a)[MI][4],
                                        const uint32_t (&b)[NI][2]) {
  using namespace sm90::detail;
  if constexpr (kOps == Fp8MmaOperands::kE4m3) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) mma_e4m3_16832(part[mi][ni], a[mi], b[ni]);
    }
  } else {
#pragma unroll
    for (int chunk = 0; chunk < 2; ++chunk) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        e4m3x4_to_f16(a[mi][2 * chunk], af[mi][0], af[mi][2]);      // row g: k lo, k hi
        e4m3x4_to_f16(a[mi][2 * chunk + 1], af[mi][1], af[mi][3]);  // row g + 8
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) e4m3x4_to_f16(b[ni][chunk], bf[ni][0], bf[ni][1]);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_f16_16816(part[mi][ni], af[mi], bf[ni]);
      }
    }
  }
}

template <Fp8MmaOperands kOps, int kRows>
__global__ void __launch_bounds__(kThreads, kRows == 128 ? 1 : 2) fp8_mma_gemm_kernel(const Params p) {
  using namespace sm90::detail;
  using T = MmaTile<kRows>;
  if (static_cast<int>(blockIdx.x) >= *p.tile_count) return;
  const MTile tile = p.tiles[blockIdx.x];
  const int g = tile.group, n0 = static_cast<int>(blockIdx.y) * kTileN;
  const int group_rows = p.group_rows[g], rows = group_rows - tile.row0;  // rows of this tile: min(rows, kRows)
  const int K = p.k, k_blocks = (K + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  const int64_t first_row = static_cast<int64_t>(p.group_start[g]) + tile.row0;
  const uint8_t* a = p.a + first_row * K;
  const uint8_t* b = p.b + g * p.b_group_stride + static_cast<int64_t>(n0) * K;
  const float* a_scale = p.a_scale + static_cast<int64_t>(p.group_start[g]) * k_blocks + tile.row0;
  const float* b_scale = p.b_scale + static_cast<int64_t>(g) * k_blocks * n_blocks + blockIdx.y;

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;

  // A row of 128 bytes is 8 chunks of 16, stored at chunk c ^ (row & 7): ldmatrix reads conflict-free.
  const auto load_stage = [&](int stage, int kb) {
    uint8_t* sa = smem + stage * T::kStageBytes;
    uint8_t* sb = sa + T::kOperandBytesA;
    const int k0 = kb * kTileK;
#pragma unroll
    for (int i = 0; i < T::kOperandBytesA / 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, r = idx >> 3, c = idx & 7, col = k0 + c * 16;
      const bool ok = col < K && r < rows;
      cp_async_16(smem_addr(sa + r * kRowBytes + ((c ^ (r & 7)) << 4)),
                  ok ? a + static_cast<int64_t>(r) * K + col : p.a, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kOperandBytesB / 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, r = idx >> 3, c = idx & 7, col = k0 + c * 16;
      const bool ok = col < K && n0 + r < p.n;
      cp_async_16(smem_addr(sb + r * kRowBytes + ((c ^ (r & 7)) << 4)),
                  ok ? b + static_cast<int64_t>(r) * K + col : p.b, ok ? 16 : 0);
    }
    if (tid < kRows) {
      const bool ok = tid < rows;
      cp_async_4(smem_addr(sb + kOperandBytesB + tid * 4),
                 ok ? a_scale + static_cast<int64_t>(kb) * group_rows + tid : p.a_scale, ok ? 4 : 0);
    }
  };

  float acc[T::kMI][T::kNI][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) load_stage(s, s);
    cp_async_commit();
  }
  for (int kb = 0; kb < k_blocks; ++kb) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kb landed for every thread; stage kb - 1 is free
    if (kb + kStages - 1 < k_blocks) load_stage((kb + kStages - 1) % kStages, kb + kStages - 1);
    cp_async_commit();
    const uint8_t* sa = smem + (kb % kStages) * T::kStageBytes;
    const uint8_t* sb = sa + T::kOperandBytesA;
    const auto* ss = reinterpret_cast<const float*>(sb + kOperandBytesB);
    const float sb_k = b_scale[static_cast<int64_t>(kb) * n_blocks] * kProductScale<kOps>;
    float part[T::kMI][T::kNI][4] = {};
#pragma unroll 1  // unrolled, the fragments of later steps are hoisted and spill
    for (int step = 0; step < kTileK / 32; ++step) {
      uint32_t af[T::kMI][4], bf[T::kNI][2];
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const int r = wm * T::kWarpRows + mi * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), c = 2 * step + (lane >> 4);
        ldmatrix_x4(smem_addr(sa + r * kRowBytes + ((c ^ (r & 7)) << 4)), af[mi][0], af[mi][1], af[mi][2],
                    af[mi][3]);
      }
#pragma unroll
      for (int nj = 0; nj < T::kNI / 2; ++nj) {
        const int r = wn * T::kWarpCols + nj * 16 + (lane >> 4) * 8 + (lane & 7), c = 2 * step + ((lane >> 3) & 1);
        ldmatrix_x4(smem_addr(sb + r * kRowBytes + ((c ^ (r & 7)) << 4)), bf[2 * nj][0], bf[2 * nj][1],
                    bf[2 * nj + 1][0], bf[2 * nj + 1][1]);
      }
      mma_k32<kOps>(part, af, bf);
    }
#pragma unroll
    for (int mi = 0; mi < T::kMI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float f = ss[wm * T::kWarpRows + mi * 16 + (lane >> 2) + 8 * h] * sb_k;
#pragma unroll
        for (int ni = 0; ni < T::kNI; ++ni) {
          acc[mi][ni][2 * h] = fmaf(part[mi][ni][2 * h], f, acc[mi][ni][2 * h]);
          acc[mi][ni][2 * h + 1] = fmaf(part[mi][ni][2 * h + 1], f, acc[mi][ni][2 * h + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * T::kWarpRows + mi * 16 + (lane >> 2) + 8 * h;
      if (r >= rows) continue;
      float* d = p.d + (first_row + r) * p.ldd;
#pragma unroll
      for (int ni = 0; ni < T::kNI; ++ni) {
        const int col = n0 + wn * T::kWarpCols + ni * 8 + 2 * (lane & 3);
        if (col + 1 < p.n) {
          *reinterpret_cast<float2*>(d + col) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        } else if (col < p.n) {
          d[col] = acc[mi][ni][2 * h];
        }
      }
    }
  }
}

template <int kRows>
void (*kernel_of(Fp8MmaOperands operands))(Params) {
  return operands == Fp8MmaOperands::kE4m3 ? &fp8_mma_gemm_kernel<Fp8MmaOperands::kE4m3, kRows>
                                           : &fp8_mma_gemm_kernel<Fp8MmaOperands::kF16, kRows>;
}

}  // namespace

size_t fp8_mma_gemm_workspace_size(int64_t num_groups, int64_t max_rows) {
  return kTableHeader + sizeof(MTile) * static_cast<size_t>(max_m_tiles(num_groups, max_rows, 32));  // every tile
}

Status fp8_mma_gemm(const Fp8GemmLaunch& l, Fp8MmaOperands operands, cudaStream_t stream) {
  const std::string what = "fp8 mma.sync GEMM: ";
  if (l.num_groups <= 0 || l.n <= 0 || l.k <= 0 || l.k % 16 != 0) {
    return InvalidArgument(what + "G=" + std::to_string(l.num_groups) + ", N=" + std::to_string(l.n) +
                           ", K=" + std::to_string(l.k) + " (K must be a positive multiple of 16)");
  }
  if (l.ldd < l.n || l.ldd % 2 != 0 || reinterpret_cast<uintptr_t>(l.d) % 8 != 0) {
    return InvalidArgument(what + "the output needs an even row stride >= N and 8-byte alignment");
  }
  const int tile_rows = fp8_small_tile(l, kSmallTileMaxRows) ? 32 : 128;
  const int64_t tiles = max_m_tiles(l.num_groups, l.max_rows, tile_rows);
  const int64_t n_tiles = (l.n + kTileN - 1) / kTileN;
  if (l.max_rows < 0 || tiles > INT32_MAX || n_tiles > 65535) {
    return InvalidArgument(what + std::to_string(l.max_rows) + " rows, N=" + std::to_string(l.n) +
                           " exceed the grid's range");
  }
  if (l.max_rows == 0) return Status::Ok();
  auto* count = static_cast<int32_t*>(l.workspace);
  auto* table = reinterpret_cast<MTile*>(static_cast<char*>(l.workspace) + kTableHeader);
  list_m_tiles<<<1, kThreads, 0, stream>>>(l.group_rows, l.num_groups, tile_rows, static_cast<int>(tiles), count,
                                           table);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8 mma.sync GEMM: tile list");
  const Params p{l.a, l.a_scale, l.b, l.b_group_stride, l.b_scale, l.d, l.ldd, l.group_start, l.group_rows,
                 l.n, l.k, count, table};
  void (*kernel)(Params) = tile_rows == 128 ? kernel_of<128>(operands) : kernel_of<32>(operands);
  const int smem = tile_rows == 128 ? MmaTile<128>::kSmemBytes : MmaTile<32>::kSmemBytes;
  MOEKIT_CUDA_CHECK(ensure_kernel_smem(reinterpret_cast<const void*>(kernel), smem));
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(n_tiles)), kThreads, smem, stream>>>(p);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8 mma.sync GEMM");
  return Status::Ok();
}

}  // namespace moekit::cuda
