// CUTLASS grouped GEMM instantiation (grouped_gemm_cutlass_sm90.cuh): bf16 in,
// fp32 accumulate, bf16 out; 64x256x64 tiles, ping-pong (two consumer
// warpgroups on alternate tiles: one in its epilogue while the other
// multiplies), clusters of 2 CTAs along M multicasting B. Half the row
// quantization of m128_n256 for groups of a few hundred rows.
#include "experts/cuda/grouped_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {
using Traits = CutlassTileTraits<64, 256, 64, 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                 cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
using Gemm = CutlassGroupedGemm<Traits>;
}  // namespace

size_t cutlass_m64n256_workspace_size(int64_t num_groups) { return cutlass_workspace_size<Gemm>(num_groups); }

Status cutlass_m64n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm90
