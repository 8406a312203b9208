// Instantiations and host launcher of the weight-streaming grouped GEMM.
#include "experts/cuda/streaming_gemm.h"

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "experts/cuda/instance_names.h"
#include "experts/cuda/stream_k_splits.h"
#include "experts/cuda/streaming_gemm.cuh"

namespace moekit::cuda::sm90 {
namespace {

//                                    warps  n8 token tiles  stages  K per stage    smem per CTA
using Rows128K64 = StreamTraits<4, 16, 6, 64>;       // 6 x (16 + 16) KB
using Rows64K64 = StreamTraits<2, 8, 4, 64>;         // 4 x (8 + 8) KB
using Rows64K64T32 = StreamTraits<2, 4, 6, 64>;      // 6 x (8 + 4) KB
using Rows32K64T16 = StreamTraits<1, 2, 6, 64>;      // 6 x (4 + 2) KB
using Rows32K64T16S4 = StreamTraits<1, 2, 4, 64>;    // 4 x (4 + 2) KB
using Rows32K64T16S3 = StreamTraits<1, 2, 3, 64>;    // 3 x (4 + 2) KB
using Rows32K64T32 = StreamTraits<1, 4, 4, 64>;      // 4 x (4 + 4) KB
using Rows32K128T16 = StreamTraits<1, 2, 4, 128>;    // 4 x (8 + 4) KB
using Rows32K128T16S3 = StreamTraits<1, 2, 3, 128>;  // 3 x (8 + 4) KB
using Rows32K128T16S2 = StreamTraits<1, 2, 2, 128>;  // 2 x (8 + 4) KB

template <class F>
auto with_traits(StreamVariant v, F&& f) {
  switch (v) {
    case StreamVariant::kRows128K64: return f(Rows128K64{});
    case StreamVariant::kRows64K64: return f(Rows64K64{});
    case StreamVariant::kRows64K64T32: return f(Rows64K64T32{});
    case StreamVariant::kRows32K64T16: return f(Rows32K64T16{});
    case StreamVariant::kRows32K64T32: return f(Rows32K64T32{});
    case StreamVariant::kRows32K128T16: return f(Rows32K128T16{});
    case StreamVariant::kRows32K64T16S4: return f(Rows32K64T16S4{});
    case StreamVariant::kRows32K128T16S3: return f(Rows32K128T16S3{});
    case StreamVariant::kRows32K128T16S2: return f(Rows32K128T16S2{});
    case StreamVariant::kRows32K64T16S3: return f(Rows32K64T16S3{});
  }
  return f(Rows128K64{});
}

}  // namespace

const char* stream_variant_name(StreamVariant v) {
  return kSm90StreamNames[static_cast<size_t>(v)];  // in the enum's order (core/kernel_instances.h)
}

std::optional<StreamVariant> parse_stream_variant(std::string_view name) {
  return parse_instance_name(kAllStreamVariants, &stream_variant_name, name);
}

int stream_variant_rows(StreamVariant v) {
  return with_traits(v, [](auto t) { return decltype(t)::kRows; });
}
int stream_variant_block_k(StreamVariant v) {
  return with_traits(v, [](auto t) { return decltype(t)::kBlockK; });
}
int stream_variant_tokens(StreamVariant v) {
  return with_traits(v, [](auto t) { return decltype(t)::kTokens; });
}
int stream_variant_smem_bytes(StreamVariant v) {
  return with_traits(v, [](auto t) { return decltype(t)::kSmemBytes; });
}

int streaming_k_splits(const GroupedGemmProblem& pr, StreamVariant v, int sm_count) {
  if (pr.epilogue != GemmEpilogue::kNone || pr.max_rows == 0) return 1;
  StreamKSplitRule r;
  r.ctas = std::min(pr.num_groups, pr.max_rows) * (pr.n / stream_variant_rows(v));
  r.smem_per_cta = stream_variant_smem_bytes(v);
  r.max_ctas_per_sm = 16;
  r.k_steps = pr.k / stream_variant_block_k(v);
  r.max_splits = kMaxStreamKSplits;
  return static_cast<int>(stream_k_splits(r, sm_count));
}

Support streaming_gemm_supports(const GroupedGemmProblem& pr, StreamVariant v) {
  if (pr.out_dtype != DType::kBF16 && pr.out_dtype != DType::kF32) {
    return Support::no(std::string("streaming GEMM output dtype ") + dtype_name(pr.out_dtype));
  }
  const int rows = stream_variant_rows(v), bk = stream_variant_block_k(v);
  if (pr.k % bk != 0) {
    return Support::no(std::string("streaming GEMM ") + stream_variant_name(v) + ": K=" + std::to_string(pr.k) +
                       " is not a multiple of " + std::to_string(bk));
  }
  if (pr.n % rows != 0) {
    return Support::no(std::string("streaming GEMM ") + stream_variant_name(v) + ": N=" + std::to_string(pr.n) +
                       " is not a multiple of " + std::to_string(rows));
  }
  if (const int optin = current_device_smem_optin(); optin > 0 && stream_variant_smem_bytes(v) > optin) {
    return Support::no(std::string("streaming GEMM ") + stream_variant_name(v) + ": " +
                       std::to_string(stream_variant_smem_bytes(v)) + " bytes of shared memory, the device has " +
                       std::to_string(optin));
  }
  if (pr.num_groups < 1 || pr.max_rows > INT32_MAX / 2 || pr.n > INT32_MAX / 2 || pr.k > INT32_MAX / 2) {
    return Support::no("streaming GEMM sizes exceed int32 indexing");
  }
  if (pr.k_splits < 1 || pr.k_splits > kMaxStreamKSplits || pr.k_splits > pr.k / bk) {
    return Support::no("streaming GEMM: " + std::to_string(pr.k_splits) + " K slices for K=" + std::to_string(pr.k));
  }
  if (pr.k_splits > 1 && (pr.epilogue != GemmEpilogue::kNone || pr.out_dtype != DType::kF32)) {
    return Support::no("streaming GEMM: K slices need an f32 partial output without an epilogue");
  }
  return Support::yes();
}

Status streaming_gemm(const GroupedGemmProblem& pr, const GroupedGemmArgs& args, StreamVariant v,
                      cudaStream_t stream, int max_group_rows) {
  const Support s = streaming_gemm_supports(pr, v);
  if (!s.ok) return Unsupported(s.reason);
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
  p.n_slabs = p.n / stream_variant_rows(v);
  p.k_splits = static_cast<int>(pr.k_splits);
  p.c_split_stride = pr.max_rows * pr.n;
  p.max_group_rows = max_group_rows;
  p.out_f32 = pr.out_dtype == DType::kF32;
  p.activation = pr.epilogue == GemmEpilogue::kActivation;
  p.gated = p.activation && pr.activation.gated();
  p.act = ActivationParams{pr.activation.kind, pr.activation.swiglu_limit, pr.activation.swiglu_alpha};
  // Each non-empty group holds at least one row, so there are at most min(G, max_rows) of them.
  const int max_groups = static_cast<int>(std::min<int64_t>(pr.num_groups, pr.max_rows));
  const cudaError_t e =
      with_traits(v, [&](auto t) { return launch_streaming_gemm<decltype(t)>(p, max_groups, stream); });
  MOEKIT_CUDA_CHECK(e);
  return Status::Ok();
}

}  // namespace moekit::cuda::sm90
