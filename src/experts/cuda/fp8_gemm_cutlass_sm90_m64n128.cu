// fp8 grouped GEMM instantiation (fp8_gemm_cutlass_sm90.cuh): 64x128 tiles,
// ping-pong (two consumer warpgroups on alternate tiles, one in its epilogue
// while the other multiplies), no cluster: half the row quantization for
// groups of a few rows.
#include "experts/cuda/fp8_gemm_cutlass_sm90.cuh"

namespace moekit::cuda::fp8_sm90 {
namespace {
using Gemm = Fp8Gemm<Fp8TileTraits<64, 128, 1, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8BlockScaledAccum,
                                   cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>>;
}  // namespace

size_t m64n128_workspace_size(int64_t num_groups) { return workspace_size<Gemm>(num_groups); }
Status m64n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream) { return run<Gemm>(launch, stream); }

}  // namespace moekit::cuda::fp8_sm90
