// The fp8 weight-streaming grouped GEMM (fp8_streaming_gemm.h).
//
// As the bf16 streaming kernel (streaming_gemm.cuh): each CTA owns a slab of
// 32·kWarps weight rows of one expert and streams it over K once through a
// cp.async pipeline; the group's token rows ride along as the narrow MMA
// operand. MMA: mma.sync m16n8k32 e4m3 x e4m3 -> f32 (sm_89+), weights as A
// (16 rows x 32 bytes: the same ldmatrix fragments as bf16's 16 x 16), tokens
// as B. A pipeline stage holds one or two 128-deep K blocks; each block's
// partial sums are scaled by sa(token, kb) * sw(row, kb), which land in shared
// memory with the stage, and added to f32 accumulators. Token rows are read
// through a_row_index (GEMM1: the quantized token rows, no permuted copy).
//
// Gated GEMM1: a warp's 32 rows are 16 gate rows (mt 0) and the 16 up rows
// (mt 1) of the same 16 intermediate columns, gathered from the checkpoint
// layout (halves: gate i, up I + i; swiglu_oai interleaved: 2i, 2i + 1), so the
// epilogue pairs them in registers. Rows past N and K past the end are
// zero-filled by cp.async (src size 0) and never stored.
//
// Blocks: blockIdx.x = (j * n_slabs + slab) * k_splits + split, j = index among
// the non-empty groups; blocks past their count exit at once. Groups with more
// rows than the token tile are done in several tiles (the slab is re-read).
#include "experts/cuda/fp8_streaming_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/instance_names.h"
#include "experts/cuda/stream_k_splits.h"
#include "experts/cuda/streaming_gemm.cuh"

namespace moekit::cuda {
namespace {

constexpr int kScaleBlock = static_cast<int>(kFp8BlockSize);

template <int kWarps_, int kTokenTiles_, int kStages_, int kBlocksPerStage_>
struct Fp8StreamTraits {
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 32 * kWarps;
  static constexpr int kTokenTiles = kTokenTiles_;
  static constexpr int kTokens = 8 * kTokenTiles;
  static constexpr int kStages = kStages_;
  // K per stage: whole scale blocks (e4m3: bytes = elements).
  static constexpr int kBlocksPerStage = kBlocksPerStage_;
  static constexpr int kBlockK = kScaleBlock * kBlocksPerStage;
  static constexpr int kChunks = kBlockK / 16;
  static constexpr int kRowBytes = kBlockK;
  static constexpr int kWStageBytes = kRows * kRowBytes;
  static constexpr int kXStageBytes = kTokens * kRowBytes;
  // Each stage's scales ride in the pipeline too: per scale block, one per weight row, one per token.
  static constexpr int kScaleStride = kRows + kTokens;
  static constexpr int kScaleStageBytes = kBlocksPerStage * kScaleStride * 4;
  static constexpr int kSmemBytes = kStages * (kWStageBytes + kXStageBytes + kScaleStageBytes);
  // The kernel is bound by its warps' issue (cp.async addressing, scale
  // handling), so its speed grows with the CTAs an SM holds (measured: an
  // instance with more shared memory per CTA is slower): the registers are
  // capped so that they allow as many CTAs as shared memory does (227 KB per
  // SM, 1 KB reserved per CTA, ~0.5 KB static).
  static constexpr int kMinBlocksPerSm = (227 * 1024) / (kSmemBytes + 1024 + 512) < 32
                                             ? (227 * 1024) / (kSmemBytes + 1024 + 512)
                                             : 32;
  // Each thread loads one fixed chunk column of its rows (tid % kChunks).
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kWLoads = kRows / kRowsPerPass;
  static_assert(kChunks % 8 == 0 && kThreads % kChunks == 0, "whole 8-chunk swizzle groups per row");
  static_assert(kTokenTiles == 1 || kTokenTiles % 2 == 0, "token tiles are loaded in pairs (ldmatrix.x4)");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kSmemBytes <= 200 * 1024, "stages must fit the shared memory of an SM");
};

struct Fp8StreamParams {
  const uint8_t* a;
  const int32_t* a_row_index;
  const float* a_scale;
  const uint8_t* b;
  const float* b_scale;
  float* c;
  const int32_t* group_start;
  const int32_t* group_rows;
  int num_groups, n, k, n_out;
  int k_blocks;         // ceil(K / 128)
  int part_rows;        // N / parts
  int part_row_blocks;  // ceil(part_rows / 128)
  int parts;
  int n_slabs, k_splits;
  int64_t c_split_stride;
  bool block_scales;
  bool activation, gated, interleaved;  // interleaved: swiglu_oai's gate 2i, up 2i + 1
  ActivationParams act;
};

// Checkpoint row of slab-local weight row r (warp r / 32, mt = bit 4, m = r % 16), or -1 past N.
template <class Tr>
__device__ __forceinline__ int weight_row(const Fp8StreamParams& p, int slab, int r) {
  if (!p.gated) {
    const int n = slab * Tr::kRows + r;
    return n < p.n ? n : -1;
  }
  const int col = (slab * Tr::kWarps + r / 32) * 16 + (r & 15);  // intermediate column
  const int mt = (r >> 4) & 1;                                    // 0 gate, 1 up
  if (col >= p.n_out) return -1;
  return p.interleaved ? 2 * col + mt : mt * p.n_out + col;
}

// Scales of checkpoint row n of group g for K block 0, and the step per K block.
__device__ __forceinline__ const float* weight_scale_row(const Fp8StreamParams& p, int g, int n) {
  const int part = n / p.part_rows;
  if (!p.block_scales) return p.b_scale + static_cast<int64_t>(g) * p.parts + part;
  const int block = part * p.part_row_blocks + (n % p.part_rows) / kScaleBlock;
  return p.b_scale + (static_cast<int64_t>(g) * p.parts * p.part_row_blocks + block) * p.k_blocks;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) fp8_streaming_gemm_kernel(const Fp8StreamParams p) {
  using namespace sm90::detail;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* w_smem = smem;
  uint8_t* x_smem = smem + Tr::kStages * Tr::kWStageBytes;
  // (kStages, kBlocksPerStage, kRows + kTokens) f32: the weight rows' scales, then the tokens'.
  float* s_smem = reinterpret_cast<float*>(x_smem + Tr::kStages * Tr::kXStageBytes);
  __shared__ int32_t token_src[Tr::kTokens];  // A row of each token of the tile, -1 = none

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x % p.k_splits;
  const int j = blockIdx.x / p.k_splits / p.n_slabs;
  const int slab = blockIdx.x / p.k_splits % p.n_slabs;
  const int g = nth_taken_group<Tr::kThreads>(j, p.num_groups, [&](int q) { return p.group_rows[q] > 0; });
  if (g < 0) return;

  const int rows = p.group_rows[g];
  const int row0 = p.group_start[g];
  const int all_k_tiles = (p.k_blocks + Tr::kBlocksPerStage - 1) / Tr::kBlocksPerStage;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(all_k_tiles) * split / p.k_splits);
  const int k_tiles = static_cast<int>(static_cast<int64_t>(all_k_tiles) * (split + 1) / p.k_splits) - kt_begin;
  float* const c_out = p.c + split * p.c_split_stride;
  const uint32_t w_base = smem_addr(w_smem), x_base = smem_addr(x_smem);
  const uint8_t* const w_group = p.b + static_cast<int64_t>(g) * p.n * p.k;

  // The rows this thread loads (one chunk column, kWLoads rows), null past N.
  const int my_chunk = tid % Tr::kChunks;
  const uint8_t* w_src[Tr::kWLoads];
#pragma unroll
  for (int i = 0; i < Tr::kWLoads; ++i) {
    const int n = weight_row<Tr>(p, slab, tid / Tr::kChunks + i * Tr::kRowsPerPass);
    w_src[i] = n >= 0 ? w_group + static_cast<int64_t>(n) * p.k + my_chunk * 16 : nullptr;
  }
  // The scales of slab row `tid` (kRows == kThreads), K block 0; a row past N takes row 0's.
  static_assert(Tr::kRows == Tr::kThreads, "one weight row's scale per thread");
  const int scale_step = p.block_scales ? 1 : 0;
  const int my_row = weight_row<Tr>(p, slab, tid);
  const float* const w_scale = weight_scale_row(p, g, my_row >= 0 ? my_row : 0);
  const uint32_t s_base = smem_addr(s_smem);

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
      const bool k_in = k0 + my_chunk * 16 < p.k;
      const uint32_t ws = w_base + stage * Tr::kWStageBytes;
#pragma unroll
      for (int i = 0; i < Tr::kWLoads; ++i) {
        const int r = tid / Tr::kChunks + i * Tr::kRowsPerPass;
        const bool ok = k_in && w_src[i] != nullptr;
        cp_async_16(ws + swz<Tr>(r, my_chunk), ok ? w_src[i] + k0 : p.b, ok ? 16 : 0);
      }
      const uint32_t xs = x_base + stage * Tr::kXStageBytes;
      for (int r = tid / Tr::kChunks; r < used_tiles * 8; r += Tr::kRowsPerPass) {
        const int src = token_src[r];
        const bool ok = k_in && src >= 0;
        cp_async_16(xs + swz<Tr>(r, my_chunk), ok ? p.a + static_cast<int64_t>(src) * p.k + k0 + my_chunk * 16 : p.a,
                    ok ? 16 : 0);
      }
#pragma unroll
      for (int b = 0; b < Tr::kBlocksPerStage; ++b) {  // a block past K, a token past the tile: scale 0
        const int kb = (kt_begin + kt) * Tr::kBlocksPerStage + b;
        const uint32_t ss = s_base + (stage * Tr::kBlocksPerStage + b) * Tr::kScaleStride * 4;
        const bool kb_in = kb < p.k_blocks;
        cp_async_4(ss + tid * 4, kb_in ? w_scale + kb * scale_step : p.b_scale, kb_in ? 4 : 0);
        for (int t = tid; t < Tr::kTokens; t += Tr::kThreads) {
          const int src = token_src[t];
          const bool ok = kb_in && src >= 0;
          cp_async_4(ss + (Tr::kRows + t) * 4, ok ? p.a_scale + static_cast<int64_t>(src) * p.k_blocks + kb : p.a_scale,
                     ok ? 4 : 0);
        }
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
      for (int b = 0; b < Tr::kBlocksPerStage; ++b) {
        // This scale block's scales, landed with its stage.
        const float* const ss = s_smem + (stage * Tr::kBlocksPerStage + b) * Tr::kScaleStride;
        float sw[2][2], sa[Tr::kTokenTiles][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) sw[mt][h] = ss[warp * 32 + mt * 16 + (lane >> 2) + 8 * h];
#pragma unroll
        for (int nt = 0; nt < Tr::kTokenTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) sa[nt][e] = ss[Tr::kRows + nt * 8 + 2 * (lane & 3) + e];

        float part[2][Tr::kTokenTiles][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < Tr::kTokenTiles; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[mt][nt][i] = 0.0f;
#pragma unroll
        for (int kq = 0; kq < kScaleBlock / 32; ++kq) {
          const int kk = b * (kScaleBlock / 32) + kq;  // 32-byte step within the stage
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const int r = warp * 32 + mt * 16 + (lane & 15);
            ldmatrix_x4(ws + swz<Tr>(r, kk * 2 + (lane >> 4)), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
          }
          uint32_t bf[Tr::kTokenTiles][2];
          if constexpr (Tr::kTokenTiles == 1) {
            ldmatrix_x2(xs + swz<Tr>(lane & 7, kk * 2 + ((lane >> 3) & 1)), bf[0][0], bf[0][1]);
          } else {
#pragma unroll
            for (int np = 0; np < Tr::kTokenTiles / 2; ++np) {
              if (2 * np >= used_tiles) break;
              // A pair's second tile may be unused: its rows are stale and its results never stored.
              const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
              ldmatrix_x4(xs + swz<Tr>(r, kk * 2 + ((lane >> 3) & 1)), bf[2 * np][0], bf[2 * np][1],
                          bf[2 * np + 1][0], bf[2 * np + 1][1]);
            }
          }
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
              if (nt < used_tiles) mma_e4m3_16832(part[mt][nt], a[mt], bf[nt]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < Tr::kTokenTiles; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[mt][nt][i] = fmaf(part[mt][nt][i], sa[nt][i & 1] * sw[mt][i >> 1], acc[mt][nt][i]);
            }
      }
    }
    cp_async_wait<0>();

    // ---- Epilogue. acc[mt][nt][i]: slab row warp*32 + mt*16 + lane/4 (+8 for i >= 2),
    // token nt*8 + 2*(lane%4) + (i & 1).
#pragma unroll
    for (int nt = 0; nt < Tr::kTokenTiles; ++nt) {
      if (nt >= used_tiles) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = nt * 8 + 2 * (lane & 3) + (i & 1);
        if (tok >= tokens) continue;
        float* const out_row = c_out + static_cast<int64_t>(row0 + t0 + tok) * p.n_out;
        const int m = (lane >> 2) + (i >= 2 ? 8 : 0);
        if (p.gated) {
          const int col = (slab * Tr::kWarps + warp) * 16 + m;
          if (col < p.n_out) out_row[col] = gated_activation(p.act, acc[0][nt][i], acc[1][nt][i]);
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const int col = slab * Tr::kRows + warp * 32 + mt * 16 + m;
            if (col < p.n_out) out_row[col] = p.activation ? plain_activation(p.act, acc[mt][nt][i]) : acc[mt][nt][i];
          }
        }
      }
    }
    __syncthreads();  // token_src and the stages are reused by the next token tile
  }
}

template <class Tr>
cudaError_t launch(const Fp8StreamParams& p, int max_nonempty_groups, cudaStream_t stream) {
  const cudaError_t e =
      ensure_kernel_smem(reinterpret_cast<const void*>(fp8_streaming_gemm_kernel<Tr>), Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  const int64_t blocks = static_cast<int64_t>(max_nonempty_groups) * p.n_slabs * p.k_splits;
  if (blocks == 0) return cudaSuccess;
  fp8_streaming_gemm_kernel<Tr><<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

//                                   warps  n8 token tiles  stages  scale blocks per stage   smem per CTA
using W1T8K128S2 = Fp8StreamTraits<1, 1, 2, 1>;   // 2 x (4 + 1) KB
using W1T8K128S3 = Fp8StreamTraits<1, 1, 3, 1>;   // 3 x (4 + 1) KB
using W1T8K256S2 = Fp8StreamTraits<1, 1, 2, 2>;   // 2 x (8 + 2) KB
using W1T16K128S2 = Fp8StreamTraits<1, 2, 2, 1>;  // 2 x (4 + 2) KB
using W1T16K256S2 = Fp8StreamTraits<1, 2, 2, 2>;  // 2 x (8 + 4) KB
using W1T32K256S2 = Fp8StreamTraits<1, 4, 2, 2>;  // 2 x (8 + 8) KB

template <class F>
auto with_traits(Fp8StreamVariant v, F&& f) {
  switch (v) {
    case Fp8StreamVariant::kW1T8K128S2: return f(W1T8K128S2{});
    case Fp8StreamVariant::kW1T8K128S3: return f(W1T8K128S3{});
    case Fp8StreamVariant::kW1T8K256S2: return f(W1T8K256S2{});
    case Fp8StreamVariant::kW1T16K128S2: return f(W1T16K128S2{});
    case Fp8StreamVariant::kW1T16K256S2: return f(W1T16K256S2{});
    case Fp8StreamVariant::kW1T32K256S2: return f(W1T32K256S2{});
  }
  return f(W1T8K128S2{});
}

int64_t slabs_of(const Fp8StreamGemm& g, int warps) {
  const int64_t per_slab = g.activation && g.act.gated() ? 16 * warps : 32 * warps;  // output columns
  return (g.n_out() + per_slab - 1) / per_slab;
}

}  // namespace

const char* fp8_stream_variant_name(Fp8StreamVariant v) {
  return kSm90Fp8StreamNames[static_cast<size_t>(v)];  // in the enum's order (core/kernel_instances.h)
}

std::optional<Fp8StreamVariant> parse_fp8_stream_variant(std::string_view name) {
  return parse_instance_name(kAllFp8StreamVariants, &fp8_stream_variant_name, name);
}

int64_t fp8_streaming_k_splits(const Fp8StreamGemm& g, Fp8StreamVariant v, int sm_count) {
  if (g.activation || g.max_rows == 0) return 1;
  const auto [smem, warps, per_stage] = with_traits(v, [](auto t) {
    using Tr = decltype(t);
    return std::tuple<int64_t, int64_t, int64_t>{Tr::kSmemBytes, Tr::kWarps, Tr::kBlocksPerStage};
  });
  StreamKSplitRule r;  // steps counted in 128-deep scale blocks, whole stages
  r.ctas = std::min(g.num_groups, g.max_rows) * slabs_of(g, static_cast<int>(warps));
  r.smem_per_cta = smem;
  r.max_ctas_per_sm = 32;
  r.k_steps = (g.k + kScaleBlock * per_stage - 1) / (kScaleBlock * per_stage) * per_stage;
  r.max_splits = kMaxFp8StreamKSplits;
  return stream_k_splits(r, sm_count);
}

Status fp8_streaming_gemm(const Fp8StreamGemm& g, Fp8StreamVariant v, cudaStream_t stream) {
  if (g.k % 16 != 0 || g.k <= 0) {
    return InvalidArgument("fp8 streaming GEMM: K=" + std::to_string(g.k) + " must be a positive multiple of 16");
  }
  const bool gated = g.activation && g.act.gated();
  if (gated && g.n % 2 != 0) return InvalidArgument("fp8 streaming GEMM: gated N=" + std::to_string(g.n) + " is odd");
  if (g.parts < 1 || g.n % g.parts != 0) return InvalidArgument("fp8 streaming GEMM: N not a multiple of its parts");
  if (g.k_splits < 1 || g.k_splits > kMaxFp8StreamKSplits || (g.k_splits > 1 && g.activation)) {
    return InvalidArgument("fp8 streaming GEMM: " + std::to_string(g.k_splits) + " K slices (at most " +
                           std::to_string(kMaxFp8StreamKSplits) + ", none with an epilogue)");
  }
  const int64_t stage_k = kScaleBlock * with_traits(v, [](auto t) { return decltype(t)::kBlocksPerStage; });
  if (g.k_splits > (g.k + stage_k - 1) / stage_k) {
    return InvalidArgument("fp8 streaming GEMM: more K slices than pipeline stages over K");
  }
  if (g.n > INT32_MAX / 2 || g.k > INT32_MAX / 2 || g.num_groups > INT32_MAX) {
    return InvalidArgument("fp8 streaming GEMM: sizes exceed int32 indexing");
  }
  if (g.max_rows == 0) return Status::Ok();
  Fp8StreamParams p{};
  p.a = g.a;
  p.a_row_index = g.a_row_index;
  p.a_scale = g.a_scale;
  p.b = g.b;
  p.b_scale = g.b_scale;
  p.c = g.c;
  p.group_start = g.group_start;
  p.group_rows = g.group_rows;
  p.num_groups = static_cast<int>(g.num_groups);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.n_out = static_cast<int>(g.n_out());
  p.k_blocks = static_cast<int>((g.k + kScaleBlock - 1) / kScaleBlock);
  p.parts = static_cast<int>(g.parts);
  p.part_rows = static_cast<int>(g.n / g.parts);
  p.part_row_blocks = (p.part_rows + kScaleBlock - 1) / kScaleBlock;
  p.k_splits = static_cast<int>(g.k_splits);
  p.c_split_stride = g.c_split_stride;
  p.block_scales = g.method == QuantMethod::kFp8Block128;
  p.activation = g.activation;
  p.gated = gated;
  p.interleaved = gate_up_layout(g.act.kind) == GateUpLayout::kInterleaved;
  p.act = ActivationParams{g.act.kind, g.act.swiglu_limit, g.act.swiglu_alpha};
  const int max_groups = static_cast<int>(std::min<int64_t>(g.num_groups, g.max_rows));
  const cudaError_t e = with_traits(v, [&](auto t) {
    using Tr = decltype(t);
    p.n_slabs = static_cast<int>(slabs_of(g, Tr::kWarps));
    return launch<Tr>(p, max_groups, stream);
  });
  MOEKIT_CUDA_CHECK(e);
  return Status::Ok();
}

}  // namespace moekit::cuda
