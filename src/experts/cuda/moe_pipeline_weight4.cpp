#include "experts/cuda/moe_pipeline_weight4.h"

#ifdef MOEKIT_WITH_CUDA

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/finalize.h"
#include "experts/cuda/weight4_streaming_gemm.h"

namespace moekit::cuda {

namespace {

// GEMM2 may cut K into slices only up to this many routed rows (as the bf16 and
// fp8 pipelines): the f32 partials then need at most kMaxW4StreamKSplits x this
// many rows of H, so the workspace sized for max_num_tokens holds any M.
constexpr int64_t kSplitMaxRows = 128;

size_t partial_rows(int64_t pairs) {
  return static_cast<size_t>(std::max(pairs, kMaxW4StreamKSplits * std::min(pairs, kSplitMaxRows)));
}

// The instance: forced by kernel.sm90_w4_stream, else the token tile by the
// mean rows per non-empty expert (one weight pass per tile of tokens).
W4StreamVariant variant_for(const ExpertsShape& s, int64_t pairs) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  if (const auto forced = parse_w4_stream_variant(o.sm90_w4_stream)) return *forced;
  const int64_t groups = std::max<int64_t>(1, std::min(s.num_experts, pairs));
  const int64_t rows = (pairs + groups - 1) / groups;
  if (rows <= 8) return W4StreamVariant::kT8K128S3;
  return rows <= 16 ? W4StreamVariant::kT16K128S3 : W4StreamVariant::kT32K128S3;
}

int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

// GEMM2 as the forward runs it, K slices included (none when batch-invariant:
// one reduction order for every M).
W4StreamGemm gemm2_of(const ExpertsShape& s, QuantMethod method, int64_t pairs, W4StreamVariant v) {
  W4StreamGemm g;
  g.method = method;
  g.num_groups = s.num_experts;
  g.n = s.hidden;
  g.k = s.intermediate;
  g.max_rows = pairs;
  g.out_f32 = true;
  g.c_split_stride = pairs * s.hidden;
  if (!s.batch_invariant && pairs <= kSplitMaxRows) g.k_splits = w4_streaming_k_splits(g, v, sm_count());
  return g;
}

}  // namespace

Weight4WorkspaceLayout weight4_workspace_layout(const ExpertsShape& s, int64_t num_tokens) {
  const int64_t pairs = num_tokens * s.top_k;
  Weight4WorkspaceLayout l;
  size_t c = 0;
  static_cast<PairWorkspaceLayout&>(l) = take_pair_workspace(&c, s, num_tokens);
  l.intermediate = take_workspace(&c, static_cast<size_t>(pairs * s.intermediate) * 2);
  l.partials = take_workspace(&c, partial_rows(pairs) * static_cast<size_t>(s.hidden) * sizeof(float));
  l.total = c;
  return l;
}

std::string weight4_gemm_plan(const ExpertsShape& s, QuantMethod method, int64_t num_tokens) {
  const int64_t pairs = num_tokens * s.top_k;
  const W4StreamVariant v = variant_for(s, pairs);
  return std::string("4-bit (") + quant_method_name(method) + ") streaming GEMMs " + w4_stream_variant_name(v) +
         ", GEMM2 in " + std::to_string(gemm2_of(s, method, pairs, v).k_splits) + " K slice(s)";
}

Status run_experts_weight4(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                           cudaStream_t stream) {
  const int64_t M = run.num_tokens, pairs = M * s.top_k;
  const Weight4WorkspaceLayout l = weight4_workspace_layout(s, M);
  char* ws = run.workspace;
  MOEKIT_RETURN_IF_ERROR(align_pairs(s, l, ws, M, run.topk_ids, run.expert_counts, stream));
  if (M == 0) return Status::Ok();
  const auto* group_start = reinterpret_cast<const int32_t*>(ws + l.group_start);
  const auto* group_rows = reinterpret_cast<const int32_t*>(ws + l.group_rows);
  auto* intermediate = reinterpret_cast<uint16_t*>(ws + l.intermediate);
  auto* partials = reinterpret_cast<float*>(ws + l.partials);
  const W4StreamVariant v = variant_for(s, pairs);

  W4StreamGemm g1;
  g1.method = w.method;
  g1.num_groups = s.num_experts;
  g1.n = s.n1();
  g1.k = s.hidden;
  g1.max_rows = pairs;
  g1.a = run.hidden;
  g1.a_row_index = reinterpret_cast<const int32_t*>(ws + l.row_token);
  g1.b = w.w13;
  g1.b_scale = w.w13_scale;
  g1.mxfp4_max_code = w.mxfp4_max_code;
  g1.bias = s.expert_bias ? w.w13_bias : nullptr;
  g1.activation = true;
  g1.act = s.activation;
  g1.c = intermediate;
  g1.group_start = group_start;
  g1.group_rows = group_rows;
  MOEKIT_RETURN_IF_ERROR(w4_streaming_gemm(g1, v, stream));

  W4StreamGemm g2 = gemm2_of(s, w.method, pairs, v);
  g2.a = intermediate;
  g2.b = w.w2;
  g2.b_scale = w.w2_scale;
  g2.mxfp4_max_code = w.mxfp4_max_code;
  g2.c = partials;
  g2.group_start = group_start;
  g2.group_rows = group_rows;
  MOEKIT_RETURN_IF_ERROR(w4_streaming_gemm(g2, v, stream));

  FinalizeArgs fa;
  fa.num_tokens = M;
  fa.top_k = s.top_k;
  fa.hidden = s.hidden;
  fa.expert_partials = partials;
  fa.k_splits = g2.k_splits;
  fa.partial_rows = pairs;
  fa.pair_row = reinterpret_cast<const int32_t*>(ws + l.pair_row);
  fa.topk_weights = run.topk_weights;
  fa.out = run.out;
  fa.skip_negative_ids = run.skip_negative_ids;
  if (s.expert_bias || run.skip_negative_ids) fa.topk_ids = run.topk_ids;
  if (s.expert_bias) fa.w2_bias = w.w2_bias;
  return finalize_weighted_sum(fa, stream);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
