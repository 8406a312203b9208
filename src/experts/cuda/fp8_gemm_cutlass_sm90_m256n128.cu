// fp8 grouped GEMM instantiation (fp8_gemm_cutlass_sm90.cuh): 256x128 tiles,
// cooperative (each consumer warpgroup 128 rows), no cluster: the B tile is
// read once per 256 rows, for groups of prefill size.
#include "experts/cuda/fp8_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::fp8_sm90 {
namespace {
using Gemm = Fp8Gemm<Fp8TileTraits<256, 128, 1, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                                   cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>>;
}  // namespace

size_t m256n128_workspace_size(int64_t num_groups) { return workspace_size<Gemm>(num_groups); }
Status m256n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream) { return run<Gemm>(launch, stream); }

}  // namespace moekit::cuda::fp8_sm90
