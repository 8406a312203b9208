// CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_sm90.cuh), mixed
// input: int4 weights (two's complement nibbles) with bf16 scales, converted
// in registers; swapped, 128 weight rows x 128 token rows x 64 of K,
// cooperative, no cluster. The int4_g128 pipeline's GEMMs from 32 rows per expert.
#include "experts/cuda/grouped_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {
using Traits = CutlassTileTraits<128, 128, 64, 1, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                 cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, /*kSwapAB=*/true,
                                 cutlass::int4b_t>;
using Gemm = CutlassGroupedGemm<Traits>;
}  // namespace

size_t cutlass_w4_int4_n128_workspace_size(int64_t num_groups) { return cutlass_workspace_size<Gemm>(num_groups); }

Status cutlass_w4_int4_n128_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm90
