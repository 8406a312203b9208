// Instantiations and host launcher of the weight-streaming grouped GEMM.
#include "experts/cuda/moe_decode_sm90.h"

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/moe_decode_sm90.cuh"

namespace moekit::cuda::sm90 {
namespace {

// 128-row slabs: 4 warps, 128-token tiles, 6 stages x (16 KB weights + 16 KB tokens).
using Slab128 = StreamTraits<4, 16, 6>;
// 64-row slabs (N not a multiple of 128, or too few slabs to fill the SMs):
// 2 warps, 64-token tiles, 4 stages x (8 KB + 8 KB), so three CTAs share an SM.
using Slab64 = StreamTraits<2, 8, 4>;
static_assert(Slab128::kBlockK == kStreamBlockK && Slab64::kBlockK == kStreamBlockK, "one K granule");

}  // namespace

Support streaming_gemm_supports(const GroupedGemmProblem& pr, int slab_rows) {
  if (pr.out_dtype != DType::kBF16 && pr.out_dtype != DType::kF32) {
    return Support::no(std::string("streaming GEMM output dtype ") + dtype_name(pr.out_dtype));
  }
  if (slab_rows != 64 && slab_rows != 128) return Support::no("streaming GEMM slab rows must be 64 or 128");
  if (pr.k % kStreamBlockK != 0) {
    return Support::no("streaming GEMM K=" + std::to_string(pr.k) + " is not a multiple of " +
                       std::to_string(kStreamBlockK));
  }
  if (pr.n % slab_rows != 0) {
    return Support::no("streaming GEMM N=" + std::to_string(pr.n) + " is not a multiple of " +
                       std::to_string(slab_rows));
  }
  if (pr.num_groups < 1 || pr.max_rows > INT32_MAX / 2 || pr.n > INT32_MAX / 2 || pr.k > INT32_MAX / 2) {
    return Support::no("streaming GEMM sizes exceed int32 indexing");
  }
  return Support::yes();
}

Status streaming_gemm(const GroupedGemmProblem& pr, const GroupedGemmArgs& args, int slab_rows, int token_tile,
                      cudaStream_t stream) {
  const Support s = streaming_gemm_supports(pr, slab_rows);
  if (!s.ok) return Unsupported(s.reason);
  if ((slab_rows == 128 && token_tile != Slab128::kTokens) || (slab_rows == 64 && token_tile != Slab64::kTokens)) {
    return InvalidArgument("streaming GEMM: no instance with slab " + std::to_string(slab_rows) + " and token tile " +
                           std::to_string(token_tile));
  }
  if (pr.max_rows == 0) return Status::Ok();
  StreamParams p{};
  p.a = reinterpret_cast<const __nv_bfloat16*>(args.a);
  p.a_row_index = pr.gather_a ? args.a_row_index : nullptr;
  p.b = reinterpret_cast<const __nv_bfloat16*>(args.b);
  p.c = args.c;
  p.group_start = args.group_start;
  p.group_rows = args.group_rows;
  p.num_groups = static_cast<int>(pr.num_groups);
  p.n = static_cast<int>(pr.n);
  p.k = static_cast<int>(pr.k);
  p.n_out = static_cast<int>(pr.n_out());
  p.n_slabs = p.n / slab_rows;
  p.out_f32 = pr.out_dtype == DType::kF32;
  p.activation = pr.epilogue == GemmEpilogue::kActivation;
  p.gated = p.activation && pr.activation.gated();
  p.act = ActivationParams{pr.activation.kind, pr.activation.swiglu_limit, pr.activation.swiglu_alpha};
  // Each non-empty group holds at least one row, so there are at most min(G, max_rows) of them.
  const int max_groups = static_cast<int>(std::min<int64_t>(pr.num_groups, pr.max_rows));
  const cudaError_t e = slab_rows == 128 ? launch_streaming_gemm<Slab128>(p, max_groups, stream)
                                         : launch_streaming_gemm<Slab64>(p, max_groups, stream);
  MOEKIT_CUDA_CHECK(e);
  return Status::Ok();
}

}  // namespace moekit::cuda::sm90
