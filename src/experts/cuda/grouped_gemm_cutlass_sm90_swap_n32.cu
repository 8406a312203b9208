// CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_sm90.cuh), swapped:
// each tile is 128 weight rows x 32 token rows x 128 of K, cooperative (two
// consumer warpgroups split the 128 weight rows), no cluster. For groups of at
// most 32 rows: the weights stream through the wide MMA side once.
#include "experts/cuda/grouped_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {
using Traits = CutlassTileTraits<128, 32, 128, 1, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                 cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, /*kSwapAB=*/true>;
using Gemm = CutlassGroupedGemm<Traits>;
}  // namespace

size_t cutlass_swap_n32_workspace_size(int64_t num_groups) { return cutlass_workspace_size<Gemm>(num_groups); }

Status cutlass_swap_n32_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm90
