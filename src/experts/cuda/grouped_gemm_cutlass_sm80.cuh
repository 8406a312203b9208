// The CUTLASS 2.x grouped GEMM kernel family (grouped_gemm_cutlass.h, the sm80
// tiles): mma.sync, ldmatrix and a multistage cp.async mainloop, so it runs on
// every GPU from sm_80 on. Each instantiation lives in its own small .cu file.
//
// Per group g:  D_g [M_g, N] = A_g [M_g, K] · B_gᵀ,  B_g [N, K] K-major,
// bf16 in, fp32 accumulate, D = acc rounded once to bf16.
//
// The kernel is persistent: one CTA per (SM, resident slot) walks the grouped
// problem's tiles, whose shapes, pointers and strides a setup kernel writes into
// device memory from group_start/group_rows (nothing waits on the host). Within
// one problem CUTLASS 2.x visits tiles along N first, so for a group of many
// rows each wave would stream all of the expert's weights again per 128 token
// rows. Each group is therefore cut into column strips one tile wide
// (sub-problem (g, j): the group's rows x columns [j·TileN, (j+1)·TileN)): a
// wave then covers every token tile of a few weight tiles, each weight tile is
// read from DRAM once, and the group's token rows, read by every strip, stay in L2.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/kernel/default_gemm_grouped.h"

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "experts/cuda/grouped_gemm_cutlass.h"

namespace moekit::cuda::sm80 {

// Tile parameters of one instantiation (STYLE.md rule 7).
template <int kTileM_, int kTileN_, int kTileK_, int kWarpM_, int kWarpN_, int kStages_>
struct CutlassSm80TileTraits {
  static constexpr int kTileM = kTileM_, kTileN = kTileN_, kTileK = kTileK_;
  static constexpr int kWarpM = kWarpM_, kWarpN = kWarpN_;
  static constexpr int kStages = kStages_;
  static_assert(kTileM % kWarpM == 0 && kTileN % kWarpN == 0, "whole warps per tile");
};

template <class Traits>
struct CutlassSm80GroupedGemm {
  using Element = cutlass::bfloat16_t;
  static constexpr int kAlignment = 8;  // 16-byte cp.async of bf16
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kAlignment, float, float,
                                                                cutlass::epilogue::thread::ScaleType::Nothing>;
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmGrouped<
      Element, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, kAlignment,  // A [rows, K]
      Element, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, kAlignment,  // B (K, N) = [N, K]
      Element, cutlass::layout::RowMajor,                                                   // D [rows, N]
      float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      cutlass::gemm::GemmShape<Traits::kTileM, Traits::kTileN, Traits::kTileK>,
      cutlass::gemm::GemmShape<Traits::kWarpM, Traits::kWarpN, Traits::kTileK>, cutlass::gemm::GemmShape<16, 8, 16>,
      Epilogue, cutlass::gemm::threadblock::GemmBatchedIdentityThreadblockSwizzle, Traits::kStages,
      cutlass::gemm::kernel::GroupScheduleMode::kDeviceOnly>::GemmKernel;
  static constexpr int kSmemBytes = static_cast<int>(sizeof(typename Kernel::SharedStorage));
  static constexpr int kTileN = Traits::kTileN;
  using LongIndex = int64_t;
  static_assert(sizeof(typename cutlass::layout::RowMajor::LongIndex) == sizeof(LongIndex), "int64 strides");

  // Device tables at the start of the workspace, each 256-byte aligned: one
  // entry per sub-problem (group, column strip).
  struct Tables {
    size_t shapes = 0;  // [P] GemmCoord (M, N, K)
    size_t ptr_a = 0, ptr_b = 0, ptr_d = 0;  // [P] Element*
    size_t lda = 0, ldb = 0, ldd = 0;        // [P] int64
    size_t total = 0;
  };
  struct TablePointers {
    cutlass::gemm::GemmCoord* shapes;
    Element** ptr_a;
    Element** ptr_b;
    Element** ptr_d;
    LongIndex* lda;
    LongIndex* ldb;
    LongIndex* ldd;
  };
  static int64_t strips(int64_t n) { return (n + kTileN - 1) / kTileN; }
  static Tables tables(int64_t num_groups, int64_t n) {
    constexpr size_t kAlign = 256;
    size_t c = 0;
    auto take = [&](size_t bytes) {
      const size_t at = c;
      c += (bytes + kAlign - 1) / kAlign * kAlign;
      return at;
    };
    const size_t p = static_cast<size_t>(num_groups * strips(n));
    Tables t;
    t.shapes = take(p * sizeof(cutlass::gemm::GemmCoord));
    t.ptr_a = take(p * sizeof(void*));
    t.ptr_b = take(p * sizeof(void*));
    t.ptr_d = take(p * sizeof(void*));
    t.lda = take(p * sizeof(LongIndex));
    t.ldb = take(p * sizeof(LongIndex));
    t.ldd = take(p * sizeof(LongIndex));
    t.total = c;
    return t;
  }
  static TablePointers pointers(char* ws, const Tables& t) {
    return {reinterpret_cast<cutlass::gemm::GemmCoord*>(ws + t.shapes), reinterpret_cast<Element**>(ws + t.ptr_a),
            reinterpret_cast<Element**>(ws + t.ptr_b),                  reinterpret_cast<Element**>(ws + t.ptr_d),
            reinterpret_cast<LongIndex*>(ws + t.lda),                   reinterpret_cast<LongIndex*>(ws + t.ldb),
            reinterpret_cast<LongIndex*>(ws + t.ldd)};
  }
};

// Writes the sub-problems: one thread per (group, strip), strips of a group adjacent.
template <class G>
__global__ void sm80_setup_kernel(CutlassGemmLaunch p, typename G::TablePointers tp, int strips) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.num_groups * strips) return;
  const int g = i / strips, j = i - g * strips;
  // The group's rows clipped to the launch's chunk; a group outside it gets 0 rows (no tiles).
  const int start = p.group_start[g];
  const int lo = max(start, p.row_begin), hi = min(start + p.group_rows[g], p.row_end);
  const int rows = p.group_rows[g] >= p.min_group_rows ? max(0, hi - lo) : 0;
  const int col0 = j * G::kTileN, cols = min(G::kTileN, p.n - col0);
  using E = typename G::Element;
  tp.shapes[i] = cutlass::gemm::GemmCoord(rows, cols, p.k);
  tp.ptr_a[i] = const_cast<E*>(reinterpret_cast<const E*>(p.a)) + static_cast<int64_t>(lo - p.a_row0) * p.k;
  tp.ptr_b[i] = const_cast<E*>(reinterpret_cast<const E*>(p.b)) + (static_cast<int64_t>(g) * p.n + col0) * p.k;
  tp.ptr_d[i] = reinterpret_cast<E*>(p.d) + static_cast<int64_t>(lo - p.d_row0) * p.n + col0;
  tp.lda[i] = p.k;
  tp.ldb[i] = p.k;
  tp.ldd[i] = p.n;
}

template <class G>
size_t cutlass_workspace_size(int64_t num_groups, int64_t n) {
  return G::tables(num_groups, n).total;
}

// CTAs resident per SM for this kernel on the current device (0: it does not fit).
template <class G>
int resident_ctas_per_sm() {
  return kernel_ctas_per_sm(reinterpret_cast<const void*>(cutlass::Kernel<typename G::Kernel>),
                            G::Kernel::kThreadCount, G::kSmemBytes);
}

template <class G>
int resident_warps_per_sm() {
  return resident_ctas_per_sm<G>() * G::Kernel::kThreadCount / 32;
}

// The adapter (grouped_gemm_cutlass.cu) checked the problem: groups, N and K
// multiples of 8, sm_count within [1, kCutlassMaxSmCount].
template <class G>
Status run_cutlass_gemm(const CutlassGemmLaunch& p, cudaStream_t stream) {
  const int per_sm = resident_ctas_per_sm<G>();
  if (per_sm < 1) {
    return Unsupported("CUTLASS sm80 grouped GEMM: the tile's " + std::to_string(G::kSmemBytes) +
                       " bytes of shared memory do not fit this device");
  }
  const int strips = static_cast<int>(G::strips(p.n));
  const typename G::Tables t = G::tables(p.num_groups, p.n);
  const typename G::TablePointers tp = G::pointers(static_cast<char*>(p.workspace), t);
  const int problems = p.num_groups * strips;
  constexpr int kSetupThreads = 128;
  sm80_setup_kernel<G><<<(problems + kSetupThreads - 1) / kSetupThreads, kSetupThreads, 0, stream>>>(p, tp, strips);
  MOEKIT_CUDA_CHECK_LAUNCH("cutlass sm80 setup_kernel");

  const int ctas = p.sm_count * per_sm;
  typename G::Kernel::Arguments args(tp.shapes, problems, ctas, typename G::Epilogue::Params{}, tp.ptr_a, tp.ptr_b,
                                     tp.ptr_d, tp.ptr_d, tp.lda, tp.ldb, tp.ldd, tp.ldd);
  typename G::Kernel::Params params(args);
  cutlass::Kernel<typename G::Kernel><<<ctas, G::Kernel::kThreadCount, G::kSmemBytes, stream>>>(params);
  MOEKIT_CUDA_CHECK_LAUNCH("CUTLASS sm80 grouped GEMM");
  return Status::Ok();
}

}  // namespace moekit::cuda::sm80
