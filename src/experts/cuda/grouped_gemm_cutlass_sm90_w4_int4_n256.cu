// CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_sm90.cuh), mixed
// input: int4 weights (two's complement nibbles) with bf16 scales, converted
// in registers; swapped, 128 weight rows x 256 token rows x 64 of K,
// cooperative (two consumer warpgroups of 64 weight rows each),
// clusters of 2 CTAs along the weight rows sharing (multicasting) the token tile.
// For groups of hundreds of rows: each converted weight serves 256 tokens.
#include "experts/cuda/grouped_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {
using Traits = CutlassTileTraits<128, 256, 64, 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                 cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, /*kSwapAB=*/true,
                                 cutlass::int4b_t>;
using Gemm = CutlassGroupedGemm<Traits>;
}  // namespace

size_t cutlass_w4_int4_n256_workspace_size(int64_t num_groups) { return cutlass_workspace_size<Gemm>(num_groups); }

Status cutlass_w4_int4_n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm90
