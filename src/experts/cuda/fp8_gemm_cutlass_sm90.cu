// The tile choice of the fp8 grouped GEMM (fp8_gemm_cutlass_sm90.h); the
// kernels are instantiated one per file (fp8_gemm_cutlass_sm90_<tile>.cu).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "experts/cuda/fp8_gemm_cutlass_sm90.h"

namespace moekit::cuda {
namespace fp8_sm90 {
size_t m128n128_workspace_size(int64_t num_groups);
Status m128n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
size_t m128n128c2_workspace_size(int64_t num_groups);
Status m128n128c2_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
size_t m256n128_workspace_size(int64_t num_groups);
Status m256n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
size_t m64n128_workspace_size(int64_t num_groups);
Status m64n128_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);
}  // namespace fp8_sm90

bool fp8_cutlass_gemm_built() { return true; }

size_t fp8_cutlass_gemm_workspace_size(int64_t num_groups) {
  // Any tile may run in a workspace sized here (the choice is made per launch).
  return std::max({fp8_sm90::m128n128_workspace_size(num_groups), fp8_sm90::m128n128c2_workspace_size(num_groups),
                   fp8_sm90::m256n128_workspace_size(num_groups), fp8_sm90::m64n128_workspace_size(num_groups)});
}

Status fp8_cutlass_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream) {
  // NOTE: MOEKIT_SM90_FP8_TILE overrides the default tile, for comparisons.
  const char* v = std::getenv("MOEKIT_SM90_FP8_TILE");
  if (v == nullptr || std::strcmp(v, "m128n128") == 0) return fp8_sm90::m128n128_gemm(launch, stream);
  if (std::strcmp(v, "m128n128c2") == 0) return fp8_sm90::m128n128c2_gemm(launch, stream);
  if (std::strcmp(v, "m256n128") == 0) return fp8_sm90::m256n128_gemm(launch, stream);
  if (std::strcmp(v, "m64n128") == 0) return fp8_sm90::m64n128_gemm(launch, stream);
  return InvalidArgument(std::string("MOEKIT_SM90_FP8_TILE=") + v +
                         ": expected m128n128, m128n128c2, m256n128 or m64n128");
}

}  // namespace moekit::cuda
