// The tile choice of the fp8 grouped GEMM (fp8_gemm_cutlass_sm90.h); the
// kernels are instantiated one per file (fp8_gemm_cutlass_sm90_<tile>.cu).
#include <algorithm>
#include <string>

#include "experts/cuda/fp8_gemm_cutlass_sm90.h"

namespace moekit::cuda {
namespace fp8_sm90 {
size_t m128n128_workspace_size(int64_t num_groups);
Status m128n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
size_t m64n128_workspace_size(int64_t num_groups);
Status m64n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
}  // namespace fp8_sm90

namespace {

// Measured on the H200 (bench --variant, four shapes x seven M): the 64-row
// ping-pong tile is 5-27% faster while groups average at most 128 rows, the
// 128-row cooperative tile 5-25% faster above (tiles 128x128 with 2-CTA
// clusters and 256x128 were slower everywhere and were dropped).
constexpr int64_t kSmallGroupRows = 128;

}  // namespace

bool fp8_cutlass_gemm_built() { return true; }

size_t fp8_cutlass_gemm_workspace_size(int64_t num_groups) {
  return std::max(fp8_sm90::m128n128_workspace_size(num_groups), fp8_sm90::m64n128_workspace_size(num_groups));
}

Status fp8_cutlass_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream) {
  return fp8_small_tile(launch, kSmallGroupRows) ? fp8_sm90::m64n128_gemm(launch, stream)
                                                 : fp8_sm90::m128n128_gemm(launch, stream);
}

}  // namespace moekit::cuda
