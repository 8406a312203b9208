// CUTLASS 2.x grouped GEMM instantiation (grouped_gemm_cutlass_sm80.cuh): bf16
// in, fp32 accumulate, bf16 out; 128x128x64 tiles, 4 warps of 64x64, 3 stages:
// 96 KB of shared memory, which every GPU from sm_80 on offers a CTA.
#include "experts/cuda/grouped_gemm_cutlass_sm80.cuh"

namespace moekit::cuda::sm80 {
namespace {
using Gemm = CutlassSm80GroupedGemm<CutlassSm80TileTraits<128, 128, 64, 64, 64, 3>>;
}  // namespace

size_t cutlass_m128n128_workspace_size(int64_t num_groups, int64_t n) {
  return cutlass_workspace_size<Gemm>(num_groups, n);
}
int cutlass_m128n128_smem_bytes() { return Gemm::kSmemBytes; }
int cutlass_m128n128_resident_warps() { return resident_warps_per_sm<Gemm>(); }
Status cutlass_m128n128_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm80
