// fp8 grouped GEMM instantiation (fp8_gemm_cutlass_sm90.cuh): 128x128 tiles,
// cooperative, clusters of 2 CTAs along M multicasting the B tile (half the
// weight reads from L2 when a group spans several row tiles).
#include "experts/cuda/fp8_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::fp8_sm90 {
namespace {
using Gemm = Fp8Gemm<Fp8TileTraits<128, 128, 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                                   cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>>;
}  // namespace

size_t m128n128c2_workspace_size(int64_t num_groups) { return workspace_size<Gemm>(num_groups); }
Status m128n128c2_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream) { return run<Gemm>(launch, stream); }

}  // namespace moekit::cuda::fp8_sm90
