// CUTLASS 2.x grouped GEMM instantiation (grouped_gemm_cutlass_sm80.cuh): bf16
// in, fp32 accumulate, bf16 out; 128x256x64 tiles, 8 warps of 64x64, 3 stages:
// 144 KB of shared memory, so A100- and Hopper-class GPUs only.
#include "experts/cuda/grouped_gemm_cutlass_sm80.cuh"

namespace moekit::cuda::sm80 {
namespace {
using Gemm = CutlassSm80GroupedGemm<CutlassSm80TileTraits<128, 256, 64, 64, 64, 3>>;
}  // namespace

size_t cutlass_m128n256_workspace_size(int64_t num_groups, int64_t n) {
  return cutlass_workspace_size<Gemm>(num_groups, n);
}
int cutlass_m128n256_smem_bytes() { return Gemm::kSmemBytes; }
int cutlass_m128n256_resident_warps() { return resident_warps_per_sm<Gemm>(); }
Status cutlass_m128n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream) {
  return run_cutlass_gemm<Gemm>(launch, stream);
}

}  // namespace moekit::cuda::sm80
