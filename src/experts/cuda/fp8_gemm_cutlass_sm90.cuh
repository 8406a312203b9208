// The blockwise-scaled fp8 grouped GEMM family (fp8_gemm_cutlass_sm90.h) and
// its launcher, templated on the tile; each instantiation lives in its own
// small .cu file (fp8_gemm_cutlass_sm90_<tile>.cu): one takes minutes to compile.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
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
#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "experts/cuda/grouped_gemm_cutlass.h"

namespace moekit::cuda::fp8_sm90 {

constexpr int kScaleBlock = 128;

// One instantiation's tile (K is one scale block, so one promotion per K tile).
template <int kTileM_, int kTileN_, int kClusterM_, class KernelSchedule_, class EpilogueSchedule_>
struct Fp8TileTraits {
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kClusterM = kClusterM_;  // CTAs along M sharing (multicasting) the B tile
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  static_assert(kTileN % kScaleBlock == 0, "an N tile spans whole weight scale blocks");
};

template <class Traits>
struct Fp8Gemm {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = float;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;     // [M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // [N, K], K contiguous
  using LayoutD = cutlass::layout::RowMajor;     // [M, N]
  static constexpr int kAlignmentAB = 16;        // 16 bytes of e4m3: TMA's granule
  static constexpr int kAlignmentD = 4;          // 16 bytes of f32
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using TileShape = cute::Shape<cute::Int<Traits::kTileM>, cute::Int<Traits::kTileN>, cute::Int<kScaleBlock>>;
  static constexpr int kClusterM = Traits::kClusterM;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::_1, cute::_1>;
  // Scales: A per (row, 128 K), B per (128 N, 128 K); both with the M/N index fastest.
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleBlock, kScaleBlock>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, void, LayoutD*,
      kAlignmentD, ElementD, LayoutD*, kAlignmentD, typename Traits::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, void, ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignmentAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Traits::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
};

// Device tables at the start of the workspace (256-byte aligned each), then CUTLASS's own workspace.
struct Tables {
  size_t shapes = 0, ptr_a = 0, ptr_b = 0, ptr_d = 0, ptr_sfa = 0, ptr_sfb = 0;
  size_t stride_a = 0, stride_b = 0, stride_d = 0, layout_sfa = 0, layout_sfb = 0;
  size_t cutlass = 0, total = 0;
};

template <class T>
__host__ __device__ T* at(void* ws, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + offset);
}

template <class G>
typename G::Gemm::Arguments make_arguments(int num_groups, int sm_count, void* ws, const Tables& t) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;  // unused when sm_count is given
  hw.sm_count = sm_count;
  typename G::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {num_groups, at<typename G::Shape>(ws, t.shapes), nullptr},
      {at<const typename G::ElementA*>(ws, t.ptr_a), at<typename G::StrideA>(ws, t.stride_a), at<const typename G::ElementB*>(ws, t.ptr_b),
       at<typename G::StrideB>(ws, t.stride_b), at<const float*>(ws, t.ptr_sfa), at<typename G::LayoutSFA>(ws, t.layout_sfa),
       at<const float*>(ws, t.ptr_sfb), at<typename G::LayoutSFB>(ws, t.layout_sfb)},
      {{}, nullptr, nullptr, at<typename G::ElementD*>(ws, t.ptr_d), at<typename G::StrideD>(ws, t.stride_d)},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  return args;
}

template <class G>
Tables tables(int64_t num_groups) {
  constexpr size_t kAlign = 256;
  size_t c = 0;
  auto take = [&c](size_t bytes) {
    const size_t offset = c;
    c += (bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  };
  const size_t n = static_cast<size_t>(num_groups);
  Tables t;
  t.shapes = take(n * sizeof(typename G::Shape));
  t.ptr_a = take(n * sizeof(void*));
  t.ptr_b = take(n * sizeof(void*));
  t.ptr_d = take(n * sizeof(void*));
  t.ptr_sfa = take(n * sizeof(void*));
  t.ptr_sfb = take(n * sizeof(void*));
  t.stride_a = take(n * sizeof(typename G::StrideA));
  t.stride_b = take(n * sizeof(typename G::StrideB));
  t.stride_d = take(n * sizeof(typename G::StrideD));
  t.layout_sfa = take(n * sizeof(typename G::LayoutSFA));
  t.layout_sfb = take(n * sizeof(typename G::LayoutSFB));
  // Host-only: with sm_count given and no host problem shapes, the size needs no device call.
  t.cutlass = take(G::Gemm::get_workspace_size(
      make_arguments<G>(static_cast<int>(num_groups), kCutlassMaxSmCount, nullptr, t)));
  t.total = c;
  return t;
}

// One thread per group: its problem, pointers, strides and scale layouts.
template <class G>
__global__ void setup_kernel(Fp8GemmLaunch p, Tables t) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= p.num_groups) return;
  void* ws = p.workspace;
  const int start = p.group_start[g], rows = p.group_rows[g];
  const int k_blocks = (p.k + kScaleBlock - 1) / kScaleBlock;
  at<typename G::Shape>(ws, t.shapes)[g] = typename G::Shape{rows, p.n, p.k};
  at<const typename G::ElementA*>(ws, t.ptr_a)[g] =
      reinterpret_cast<const typename G::ElementA*>(p.a) + static_cast<int64_t>(start) * p.k;
  at<const typename G::ElementB*>(ws, t.ptr_b)[g] =
      reinterpret_cast<const typename G::ElementB*>(p.b) + static_cast<int64_t>(g) * p.b_group_stride;
  at<typename G::ElementD*>(ws, t.ptr_d)[g] = p.d + static_cast<int64_t>(start) * p.ldd;
  at<const float*>(ws, t.ptr_sfa)[g] = p.a_scale + static_cast<int64_t>(start) * k_blocks;
  at<const float*>(ws, t.ptr_sfb)[g] =
      p.b_scale + static_cast<int64_t>(g) * k_blocks * ((p.n + kScaleBlock - 1) / kScaleBlock);
  typename G::StrideA sa{};
  cute::get<0>(sa) = p.k;  // A: row stride K, K mode unit
  typename G::StrideB sb{};
  cute::get<0>(sb) = p.k;  // B: row stride K, K mode unit
  typename G::StrideD sd{};
  cute::get<0>(sd) = p.ldd;  // D: row stride ldd, N mode unit
  at<typename G::StrideA>(ws, t.stride_a)[g] = sa;
  at<typename G::StrideB>(ws, t.stride_b)[g] = sb;
  at<typename G::StrideD>(ws, t.stride_d)[g] = sd;
  const auto mnk = cute::make_shape(rows, p.n, p.k, 1);
  at<typename G::LayoutSFA>(ws, t.layout_sfa)[g] = G::ScaleConfig::tile_atom_to_shape_SFA(mnk);
  at<typename G::LayoutSFB>(ws, t.layout_sfb)[g] = G::ScaleConfig::tile_atom_to_shape_SFB(mnk);
}

template <class G>
size_t workspace_size(int64_t num_groups) {
  return tables<G>(num_groups).total;
}

template <class G>
Status run(const Fp8GemmLaunch& p, cudaStream_t stream) {
  if (p.num_groups < 1) return InvalidArgument("fp8 CUTLASS grouped GEMM: no groups");
  if (p.k % 16 != 0 || p.ldd % 4 != 0 || p.ldd < p.n) {
    return InvalidArgument("fp8 CUTLASS grouped GEMM: needs K % 16 == 0 and ldd >= N with ldd % 4 == 0, got N=" +
                           std::to_string(p.n) + ", K=" + std::to_string(p.k) + ", ldd=" + std::to_string(p.ldd));
  }
  int device = 0, sms = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int sm_count = sms < kCutlassMaxSmCount ? sms : kCutlassMaxSmCount;
  const Tables t = tables<G>(p.num_groups);
  constexpr int kSetupThreads = 128;
  setup_kernel<G><<<(p.num_groups + kSetupThreads - 1) / kSetupThreads, kSetupThreads, 0, stream>>>(p, t);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8 cutlass setup_kernel");

  const auto args = make_arguments<G>(p.num_groups, sm_count, p.workspace, t);
  typename G::Gemm gemm;
  cutlass::Status s = gemm.can_implement(args);
  if (s != cutlass::Status::kSuccess) {
    return Unsupported(std::string("fp8 CUTLASS grouped GEMM cannot implement N=") + std::to_string(p.n) +
                       ", K=" + std::to_string(p.k) + ": " + cutlassGetStatusString(s));
  }
  return launch_cutlass_kernel<typename G::Kernel, G::kClusterM>(args, static_cast<char*>(p.workspace) + t.cutlass,
                                                                 stream, "fp8 CUTLASS grouped GEMM");
}

}  // namespace moekit::cuda::fp8_sm90
