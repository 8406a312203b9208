// The CUTLASS sm90 grouped GEMM kernel family and its typed host launcher
// (grouped_gemm_cutlass.h). Each instantiation lives in its own small .cu
// file: one takes minutes to compile.
//
// Per group g:  D_g [M_g, N] = A_g [M_g, K] · B_gᵀ,  B_g [N, K] K-major.
// A swapped instantiation (kSwapAB) computes D_gᵀ = B_g · A_gᵀ instead: the
// weight rows N fill the 128-row MMA side and the few token rows M_g the narrow
// side (16..64 wide), so a group of 16 rows pads to a 32-wide tile, not a 64-row
// one. D_gᵀ in column-major order is D_g in row-major order: the same memory.
// A 4-bit instantiation (WeightElement int4b_t; swapped) is CUTLASS's
// mixed-input GEMM: the packed weights and one bf16 scale per (weight row,
// scale group) come in by TMA, and the consumer warpgroups convert each weight
// to bf16 in registers, multiply it by its scale (one bf16 rounding) and feed
// it to the register-sourced wgmma. Its K tile is at least 64 (four MMA K
// blocks) and takes one scale per row, so scale groups are multiples of 64.
// The grouped problem (shapes, pointer and stride arrays) lives in device
// memory, written by setup_kernel from group_start/group_rows; the host passes
// no problem shapes, so the persistent grid is one CTA per SM and the tile
// scheduler walks the groups on the device. Groups with M_g = 0 have no tiles.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#include "core/cuda_check.h"
#include "experts/cuda/cutlass_launch_sm90.cuh"
#include "experts/cuda/grouped_gemm_cutlass.h"

namespace moekit::cuda::sm90 {

// Tile parameters of one instantiation (STYLE.md rule 7).
// Tile sizes are in the kernel's (M, N, K) terms: with kSwapAB, M counts weight
// rows and N token rows.
// WeightElement: bf16, or a 4-bit type (mixed input, swapped only).
template <int kTileM_, int kTileN_, int kTileK_, int kClusterM_, class KernelSchedule_, class EpilogueSchedule_,
          bool kSwapAB_ = false, class WeightElement_ = cutlass::bfloat16_t>
struct CutlassTileTraits {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = kTileK_;
  static constexpr int kClusterM = kClusterM_;  // CTAs of one cluster along M share (multicast) the B tile
  static constexpr bool kSwapAB = kSwapAB_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  using WeightElement = WeightElement_;
  static constexpr bool kWeight4 = cutlass::sizeof_bits<WeightElement>::value == 4;
  static_assert(kWeight4 || std::is_same_v<WeightElement, cutlass::bfloat16_t>, "bf16 or 4-bit weights");
  static_assert(!kWeight4 || kSwapAB, "4-bit weights are the converted (A) operand: swapped");
  static_assert(kTileK * 2 % 128 == 0, "a K tile spans whole 128-byte swizzle rows of bf16");
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");
};

template <class Traits>
struct CutlassGroupedGemm {
  static constexpr bool kSwapAB = Traits::kSwapAB;
  static constexpr bool kWeight4 = Traits::kWeight4;
  // The kernel's operands: A is the weights when swapped, else the tokens.
  using ElementA = std::conditional_t<kSwapAB, typename Traits::WeightElement, cutlass::bfloat16_t>;
  using ElementB = cutlass::bfloat16_t;
  using ElementD = cutlass::bfloat16_t;
  using ElementScale = cutlass::bfloat16_t;  // 4-bit: one per (weight row, scale group)
  using ElementAccumulator = float;
  // Mixed input: the converted operand comes with its scale type.
  using MainloopElementA = std::conditional_t<kWeight4, cute::tuple<ElementA, ElementScale>, ElementA>;
  static constexpr int kAlignmentA = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16 bytes: TMA's granule
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous (swapped: the weights [N, K])
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) column-major = [N, K] K contiguous (swapped: the tokens)
  // [M, N] row-major; swapped, the kernel's (weight row, token row) output is column-major: [rows, N] row-major.
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignment = 8;           // 16 bytes of bf16
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group
  using TileShape = cute::Shape<cute::Int<Traits::kTileM>, cute::Int<Traits::kTileN>, cute::Int<Traits::kTileK>>;
  static constexpr int kClusterM = Traits::kClusterM;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>;

  // No source C (void): D = acc, rounded once to bf16.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void, LayoutD*,
      kAlignment, ElementD, LayoutD*, kAlignment, typename Traits::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void, ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, MainloopElementA, LayoutA*, kAlignmentA, ElementB,
      LayoutB*, kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Traits::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using StrideS = cute::Stride<cute::_1, int64_t, int64_t>;  // the mixed-input mainloop's scale stride
  using Shape = typename ProblemShape::UnderlyingProblemShape;

  // Device tables at the start of the workspace, each 256-byte aligned, then CUTLASS's own workspace.
  struct Tables {
    size_t shapes = 0;    // [G] (M, N, K)
    size_t ptr_a = 0;     // [G] const ElementA*
    size_t ptr_b = 0;     // [G] const ElementB*
    size_t ptr_d = 0;     // [G] ElementD*
    size_t stride_a = 0;  // [G] StrideA
    size_t stride_b = 0;  // [G] StrideB
    size_t stride_d = 0;  // [G] StrideD
    size_t ptr_s = 0;     // [G] const ElementScale*, 4-bit only
    size_t stride_s = 0;  // [G] StrideS, 4-bit only
    size_t cutlass = 0;   // Gemm::get_workspace_size bytes
    size_t total = 0;
  };
  // The tables' typed addresses in a workspace.
  struct TablePointers {
    Shape* shapes;
    const ElementA** ptr_a;
    const ElementB** ptr_b;
    ElementD** ptr_d;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
    const ElementScale** ptr_s;
    StrideS* stride_s;
  };
  static TablePointers pointers(char* ws, const Tables& t) {
    return {reinterpret_cast<Shape*>(ws + t.shapes),           reinterpret_cast<const ElementA**>(ws + t.ptr_a),
            reinterpret_cast<const ElementB**>(ws + t.ptr_b),  reinterpret_cast<ElementD**>(ws + t.ptr_d),
            reinterpret_cast<StrideA*>(ws + t.stride_a),       reinterpret_cast<StrideB*>(ws + t.stride_b),
            reinterpret_cast<StrideD*>(ws + t.stride_d),       reinterpret_cast<const ElementScale**>(ws + t.ptr_s),
            reinterpret_cast<StrideS*>(ws + t.stride_s)};
  }
};

// Writes the grouped problem: one thread per group.
template <class G>
__global__ void setup_kernel(CutlassGemmLaunch p, typename G::TablePointers tp) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.num_groups) return;
  // The group's rows clipped to the launch's chunk; a group outside it gets 0 rows (no tiles).
  const int start = p.group_start[g];
  const int lo = max(start, p.row_begin), hi = min(start + p.group_rows[g], p.row_end);
  const int rows = p.group_rows[g] >= p.min_group_rows ? max(0, hi - lo) : 0;
  const auto* tokens = reinterpret_cast<const char*>(p.a) + static_cast<int64_t>(lo - p.a_row0) * p.k * 2;
  // Group g's weights: N·K bf16, or N·K/2 bytes packed two to a byte.
  const int64_t weight_bytes = static_cast<int64_t>(p.n) * p.k * (G::kWeight4 ? 1 : 4) / 2;
  const auto* weights = static_cast<const char*>(p.b) + g * weight_bytes;
  tp.ptr_a[g] = reinterpret_cast<const typename G::ElementA*>(G::kSwapAB ? weights : tokens);
  tp.ptr_b[g] = reinterpret_cast<const typename G::ElementB*>(G::kSwapAB ? tokens : weights);
  tp.ptr_d[g] = reinterpret_cast<typename G::ElementD*>(p.d) + static_cast<int64_t>(lo - p.d_row0) * p.n;
  typename G::StrideA sa{};
  cute::get<0>(sa) = p.k;  // A: row stride K (M mode), K mode unit
  typename G::StrideB sb{};
  cute::get<0>(sb) = p.k;  // B: row stride K (N mode), K mode unit
  typename G::StrideD sd{};
  if constexpr (G::kSwapAB) {
    tp.shapes[g] = typename G::Shape{p.n, rows, p.k};
    cute::get<1>(sd) = p.n;  // D: (weight row, token row), token-row stride N, weight-row mode unit
  } else {
    tp.shapes[g] = typename G::Shape{rows, p.n, p.k};
    cute::get<0>(sd) = p.n;  // D: row stride N (M mode), N mode unit
  }
  tp.stride_a[g] = sa;
  tp.stride_b[g] = sb;
  tp.stride_d[g] = sd;
  if constexpr (G::kWeight4) {
    // Scales [K/group, N] per group: weight rows contiguous, one row per scale group.
    const int64_t scale_rows = p.k / p.scale_group;
    tp.ptr_s[g] = reinterpret_cast<const typename G::ElementScale*>(p.b_scale) + g * scale_rows * p.n;
    typename G::StrideS ss{};
    cute::get<1>(ss) = p.n;
    cute::get<2>(ss) = scale_rows * p.n;
    tp.stride_s[g] = ss;
  }
}

template <class G>
typename G::Gemm::Arguments make_arguments(int num_groups, int sm_count, int scale_group, char* ws,
                                           const typename G::Tables& t) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;  // unused when sm_count is given
  hw.sm_count = sm_count;
  const typename G::TablePointers tp = G::pointers(ws, t);
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {num_groups, tp.shapes, nullptr};
  if constexpr (G::kWeight4) {
    args.mainloop = {tp.ptr_a, tp.stride_a, tp.ptr_b, tp.stride_b, tp.ptr_s, tp.stride_s, scale_group};
  } else {
    args.mainloop = {tp.ptr_a, tp.stride_a, tp.ptr_b, tp.stride_b};
  }
  args.epilogue = {{}, nullptr, nullptr, tp.ptr_d, tp.stride_d};
  args.hw_info = hw;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  // NOTE: swapped, the tiles of one weight block (all token tiles of a group) run
  // next to each other, so a weight tile is read from DRAM once and its other
  // readers hit L2; along M the next token tile would read the whole group again.
  if constexpr (G::kSwapAB) {
    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongN;
  }
  return args;
}

template <class G>
typename G::Tables cutlass_tables(int64_t num_groups) {
  constexpr size_t kAlign = 256;
  auto take = [](size_t* c, size_t bytes) {
    const size_t at = *c;
    *c += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  };
  const size_t n = static_cast<size_t>(num_groups);
  typename G::Tables t;
  size_t c = 0;
  t.shapes = take(&c, n * sizeof(typename G::Shape));
  t.ptr_a = take(&c, n * sizeof(void*));
  t.ptr_b = take(&c, n * sizeof(void*));
  t.ptr_d = take(&c, n * sizeof(void*));
  t.stride_a = take(&c, n * sizeof(typename G::StrideA));
  t.stride_b = take(&c, n * sizeof(typename G::StrideB));
  t.stride_d = take(&c, n * sizeof(typename G::StrideD));
  if constexpr (G::kWeight4) {
    t.ptr_s = take(&c, n * sizeof(void*));
    t.stride_s = take(&c, n * sizeof(typename G::StrideS));
  }
  // Host-only: with sm_count given and no host problem shapes, the size needs no device call.
  const auto args = make_arguments<G>(static_cast<int>(num_groups), kCutlassMaxSmCount,
                                      /*scale_group (sizes do not depend on it)=*/128, nullptr, t);
  t.cutlass = take(&c, G::Gemm::get_workspace_size(args));
  t.total = c;
  return t;
}

template <class G>
size_t cutlass_workspace_size(int64_t num_groups) {
  return cutlass_tables<G>(num_groups).total;
}

template <class G>
Status run_cutlass_gemm(const CutlassGemmLaunch& p, cudaStream_t stream) {
  if (p.num_groups < 1) return InvalidArgument("CUTLASS grouped GEMM: no groups");
  if (p.sm_count < 1 || p.sm_count > kCutlassMaxSmCount) {
    return InvalidArgument("CUTLASS grouped GEMM: sm_count " + std::to_string(p.sm_count) + " outside [1, " +
                           std::to_string(kCutlassMaxSmCount) + "]");
  }
  const typename G::Tables t = cutlass_tables<G>(p.num_groups);
  char* ws = static_cast<char*>(p.workspace);
  if (G::kWeight4 && (p.b_scale == nullptr || p.scale_group < 1 || p.k % p.scale_group != 0)) {
    return InvalidArgument("CUTLASS 4-bit grouped GEMM: scales and a scale group dividing K=" + std::to_string(p.k) +
                           " required");
  }
  constexpr int kSetupThreads = 128;
  setup_kernel<G><<<(p.num_groups + kSetupThreads - 1) / kSetupThreads, kSetupThreads, 0, stream>>>(
      p, G::pointers(ws, t));
  MOEKIT_CUDA_CHECK_LAUNCH("cutlass setup_kernel");

  const auto args = make_arguments<G>(p.num_groups, p.sm_count, p.scale_group, ws, t);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) {
    return Unsupported(std::string("CUTLASS grouped GEMM cannot implement N=") + std::to_string(p.n) +
                       ", K=" + std::to_string(p.k) + ": " + cutlassGetStatusString(s));
  }
  return launch_cutlass_kernel<typename G::Kernel, G::kClusterM>(args, ws + t.cutlass, stream, "CUTLASS grouped GEMM");
}

}  // namespace moekit::cuda::sm90
