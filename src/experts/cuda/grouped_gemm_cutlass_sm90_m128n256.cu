// CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_sm90.cuh): bf16 in,
// fp32 accumulate, bf16 out; 128x256x64 tiles, cooperative (two consumer
// warpgroups split one tile), clusters of 2 CTAs along M multicasting B.
#include "experts/cuda/grouped_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {
using Traits = CutlassTileTraits<128, 256, 64, 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                 cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using Gemm = CutlassGroupedGemm<Traits>;
}  // namespace

size_t cutlass_m128n256_workspace_size(int64_t num_groups) { return cutlass_workspace_size<Gemm>(num_groups); }

Status cutlass_m128n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm90
