#include "experts/cuda/moe_pipeline_weight4.h"

#ifdef MOEKIT_WITH_CUDA

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/expert_extras.h"
#include "experts/cuda/finalize.h"
#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/grouped_gemm_cutlass.h"
#include "experts/cuda/weight4_dequant.h"
#include "experts/cuda/weight4_streaming_gemm.h"

namespace moekit::cuda {

namespace {

// GEMM2 may cut K into slices only up to this many routed rows (as the bf16 and
// fp8 pipelines): the f32 partials then need at most kMaxW4StreamKSplits x this
// many rows of H, so the workspace sized for max_num_tokens holds any M.
constexpr int64_t kSplitMaxRows = 128;
// The dequant path's bf16 weights of one chunk of experts take at most this much
// workspace (at least one expert).
constexpr size_t kDequantChunkBytes = size_t{1} << 30;

size_t partial_rows(int64_t pairs) {
  return static_cast<size_t>(std::max(pairs, kMaxW4StreamKSplits * std::min(pairs, kSplitMaxRows)));
}

int64_t mean_rows(const ExpertsShape& s, int64_t pairs) {
  const int64_t groups = std::max<int64_t>(1, std::min(s.num_experts, pairs));
  return (pairs + groups - 1) / groups;
}

// The streaming instance: forced by kernel.sm90_w4_stream, else the token tile
// by the mean rows per non-empty expert (one weight pass per tile of tokens).
W4StreamVariant variant_for(const ExpertsShape& s, int64_t pairs) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  if (const auto forced = parse_w4_stream_variant(o.sm90_w4_stream)) return *forced;
  const int64_t rows = mean_rows(s, pairs);
  if (rows <= 8) return W4StreamVariant::kW4T8K128S3;
  if (rows <= 16) return W4StreamVariant::kW4T16K128S3;
  return rows <= 32 ? W4StreamVariant::kW4T32K128S3 : W4StreamVariant::kW4T64K128S3;
}

// GEMM2 as the streaming path runs it, K slices included (none when
// batch-invariant: one reduction order for every M).
W4StreamGemm gemm2_of(const ExpertsShape& s, QuantMethod method, int64_t pairs, W4StreamVariant v) {
  W4StreamGemm g;
  g.method = method;
  g.num_groups = s.num_experts;
  g.n = s.hidden;
  g.k = s.intermediate;
  g.max_rows = pairs;
  g.out_f32 = true;
  g.c_split_stride = pairs * s.hidden;
  if (!s.batch_invariant && pairs <= kSplitMaxRows) g.k_splits = w4_streaming_k_splits(g, v, current_sm_count());
  return g;
}

int64_t dequant_chunk_experts(const ExpertsShape& s) {
  const size_t per_expert = static_cast<size_t>(std::max(s.n1() * s.hidden, s.hidden * s.intermediate)) * 2;
  return std::clamp<int64_t>(static_cast<int64_t>(kDequantChunkBytes / per_expert), 1, s.num_experts);
}

// The bf16 GEMMs of one chunk of `experts` experts (the bf16 pipeline's problems).
GroupedGemmProblem chunk_gemm1(const ExpertsShape& s, int64_t num_tokens, int64_t experts) {
  GroupedGemmProblem p = gemm1_problem(s, num_tokens);
  p.num_groups = experts;
  p.gather_room = false;  // every buffer of the forward is busy across chunks
  return p;
}
GroupedGemmProblem chunk_gemm2(const ExpertsShape& s, int64_t num_tokens, int64_t experts) {
  GroupedGemmProblem p = gemm2_problem(s, num_tokens);
  p.num_groups = experts;
  return p;
}

Status run_streaming(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                     const Weight4WorkspaceLayout& l, FinalizeArgs* fa, cudaStream_t stream) {
  const int64_t pairs = run.num_tokens * s.top_k;
  char* ws = run.workspace;
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
  g1.c = ws + l.intermediate;
  g1.group_start = reinterpret_cast<const int32_t*>(ws + l.group_start);
  g1.group_rows = reinterpret_cast<const int32_t*>(ws + l.group_rows);
  MOEKIT_RETURN_IF_ERROR(w4_streaming_gemm(g1, v, stream));

  W4StreamGemm g2 = gemm2_of(s, w.method, pairs, v);
  g2.a = reinterpret_cast<const uint16_t*>(ws + l.intermediate);
  g2.b = w.w2;
  g2.b_scale = w.w2_scale;
  g2.mxfp4_max_code = w.mxfp4_max_code;
  g2.c = ws + l.partials;
  g2.group_start = g1.group_start;
  g2.group_rows = g1.group_rows;
  MOEKIT_RETURN_IF_ERROR(w4_streaming_gemm(g2, v, stream));
  fa->expert_partials = reinterpret_cast<const float*>(ws + l.partials);
  fa->k_splits = g2.k_splits;
  fa->partial_rows = pairs;
  return Status::Ok();
}

// The gate/up bias and the activation over GEMM1's plain output (expert_bias),
// for `experts` experts from first_expert on.
Status bias_then_activation(const ExpertsShape& s, const Weight4ExpertWeights& w, const Weight4WorkspaceLayout& l,
                            char* ws, int64_t num_tokens, int64_t first_expert, int64_t experts, cudaStream_t stream) {
  BiasActivationArgs ba;
  ba.max_rows = num_tokens * s.top_k;
  ba.num_groups = experts;
  ba.n1 = s.n1();
  ba.intermediate = s.intermediate;
  ba.activation = s.activation;
  ba.gemm1_out = reinterpret_cast<const uint16_t*>(ws + l.gemm1_raw);
  ba.bias = w.w13_bias + first_expert * s.n1();
  ba.group_start = reinterpret_cast<const int32_t*>(ws + l.group_start) + first_expert;
  ba.group_rows = reinterpret_cast<const int32_t*>(ws + l.group_rows) + first_expert;
  ba.inter = reinterpret_cast<uint16_t*>(ws + l.intermediate);
  return bias_activation(ba, stream);
}

// The mixed-input tile: forced by kernel.sm90_w4_tile, else by the mean rows per expert.
CutlassW4Tile mixed_tile(const ExpertsShape& s, int64_t num_tokens) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  if (!o.sm90_w4_tile.empty()) return o.sm90_w4_tile == "n256" ? CutlassW4Tile::kN256 : CutlassW4Tile::kN128;
  return mean_rows(s, num_tokens * s.top_k) >= kWeight4MixedWideRows ? CutlassW4Tile::kN256 : CutlassW4Tile::kN128;
}

#if MOEKIT_HAVE_CUTLASS
// The prepared scales of an [E, n, k] weight as bf16 in plain row order, for the mixed-input GEMM.
Status bf16_scales_of(const ExpertsShape& s, QuantMethod method, const void* scales, int64_t n, int64_t k,
                      uint16_t* out, cudaStream_t stream) {
  Weight4DequantArgs d;
  d.method = method;
  d.num_experts = s.num_experts;
  d.n = n;
  d.k = k;
  d.scales = scales;
  d.out = out;
  return weight4_bf16_scales(d, stream);
}

Status run_mixed(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                 const Weight4WorkspaceLayout& l, FinalizeArgs* fa, cudaStream_t stream) {
  const int64_t M = run.num_tokens, N1 = s.n1(), H = s.hidden, I = s.intermediate;
  char* ws = run.workspace;
  auto* scales = reinterpret_cast<uint16_t*>(ws + l.bf16_scales);
  auto* inter = reinterpret_cast<uint16_t*>(ws + l.intermediate);
  auto* y = reinterpret_cast<uint16_t*>(ws + l.partials);  // [M·k, H] bf16
  MOEKIT_RETURN_IF_ERROR(bf16_scales_of(s, w.method, w.w13_scale, N1, H, scales, stream));
  GroupedGemmArgs g1;
  g1.a = run.hidden;
  g1.a_row_index = reinterpret_cast<const int32_t*>(ws + l.row_token);
  g1.c = s.expert_bias ? static_cast<void*>(ws + l.gemm1_raw) : inter;
  g1.group_start = reinterpret_cast<const int32_t*>(ws + l.group_start);
  g1.group_rows = reinterpret_cast<const int32_t*>(ws + l.group_rows);
  g1.gather_room = y;  // GEMM2 fills it only later
  g1.workspace = ws + l.gemm1_scratch;
  const CutlassW4Tile tile = mixed_tile(s, M);
  MOEKIT_RETURN_IF_ERROR(
      cutlass_weight4_grouped_gemm(gemm1_problem(s, M), g1, {w.method, w.w13, scales}, tile, stream));
  if (s.expert_bias) MOEKIT_RETURN_IF_ERROR(bias_then_activation(s, w, l, ws, M, 0, s.num_experts, stream));
  MOEKIT_RETURN_IF_ERROR(bf16_scales_of(s, w.method, w.w2_scale, H, I, scales, stream));
  GroupedGemmArgs g2;
  g2.a = inter;
  g2.c = y;
  g2.group_start = g1.group_start;
  g2.group_rows = g1.group_rows;
  g2.workspace = ws + l.gemm2_scratch;
  MOEKIT_RETURN_IF_ERROR(
      cutlass_weight4_grouped_gemm(gemm2_problem(s, M), g2, {w.method, w.w2, scales}, tile, stream));
  fa->expert_out = y;
  return Status::Ok();
}
#endif

Status run_dequant(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                   const Weight4WorkspaceLayout& l, FinalizeArgs* fa, cudaStream_t stream) {
  const int64_t M = run.num_tokens, E = s.num_experts, N1 = s.n1(), H = s.hidden, I = s.intermediate;
  char* ws = run.workspace;
  const auto* group_start = reinterpret_cast<const int32_t*>(ws + l.group_start);
  const auto* group_rows = reinterpret_cast<const int32_t*>(ws + l.group_rows);
  auto* bf16_weights = reinterpret_cast<uint16_t*>(ws + l.dequant);
  auto* inter = reinterpret_cast<uint16_t*>(ws + l.intermediate);
  auto* y = reinterpret_cast<uint16_t*>(ws + l.partials);  // [M·k, H] bf16
  for (int64_t e0 = 0; e0 < E; e0 += l.chunk_experts) {
    const int64_t ec = std::min(l.chunk_experts, E - e0);
    Weight4DequantArgs d;
    d.method = w.method;
    d.num_experts = ec;
    d.first_expert = e0;
    d.n = N1;
    d.k = H;
    d.packed = w.w13;
    d.scales = w.w13_scale;
    d.out = bf16_weights;
    MOEKIT_RETURN_IF_ERROR(dequantize_weight4(d, stream));
    GroupedGemmArgs g1;
    g1.a = run.hidden;
    g1.a_row_index = reinterpret_cast<const int32_t*>(ws + l.row_token);
    g1.b = bf16_weights;
    g1.c = s.expert_bias ? static_cast<void*>(ws + l.gemm1_raw) : inter;
    g1.group_start = group_start + e0;
    g1.group_rows = group_rows + e0;
    g1.workspace = ws + l.gemm1_scratch;
    MOEKIT_RETURN_IF_ERROR(grouped_gemm(chunk_gemm1(s, M, ec), g1, stream));
    if (s.expert_bias) MOEKIT_RETURN_IF_ERROR(bias_then_activation(s, w, l, ws, M, e0, ec, stream));
    d.n = H;
    d.k = I;
    d.packed = w.w2;
    d.scales = w.w2_scale;
    MOEKIT_RETURN_IF_ERROR(dequantize_weight4(d, stream));
    GroupedGemmArgs g2;
    g2.a = inter;
    g2.b = bf16_weights;
    g2.c = y;
    g2.group_start = group_start + e0;
    g2.group_rows = group_rows + e0;
    g2.workspace = ws + l.gemm2_scratch;
    MOEKIT_RETURN_IF_ERROR(grouped_gemm(chunk_gemm2(s, M, ec), g2, stream));
  }
  fa->expert_out = y;
  return Status::Ok();
}

}  // namespace

Support weight4_mixed_gemm_supports(const ExpertsShape& s, QuantMethod method) {
#if MOEKIT_HAVE_CUTLASS
  const Support g1 = cutlass_weight4_grouped_gemm_supports(gemm1_problem(s, 1), method);
  return g1.ok ? cutlass_weight4_grouped_gemm_supports(gemm2_problem(s, 1), method) : g1;
#else
  (void)s;
  (void)method;
  return Support::no("4-bit mixed-input GEMM: this build has no CUTLASS kernels");
#endif
}

Weight4GemmPath weight4_gemm_path(const ExpertsShape& s, QuantMethod method, int64_t num_tokens) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  if (o.sm90_w4_gemm == "streaming") return Weight4GemmPath::kStreaming;
  if (o.sm90_w4_gemm == "mixed") return Weight4GemmPath::kMixed;
  if (o.sm90_w4_gemm == "dequant") return Weight4GemmPath::kDequant;
  if (s.batch_invariant) return Weight4GemmPath::kStreaming;
  const int64_t rows = mean_rows(s, num_tokens * s.top_k);
  if (rows >= kWeight4MixedMinRows && weight4_mixed_gemm_supports(s, method).ok) return Weight4GemmPath::kMixed;
  return rows > kWeight4DequantMinRows ? Weight4GemmPath::kDequant : Weight4GemmPath::kStreaming;
}

Weight4WorkspaceLayout weight4_workspace_layout(const ExpertsShape& s, QuantMethod method, int64_t num_tokens) {
  const int64_t pairs = num_tokens * s.top_k;
  Weight4WorkspaceLayout l;
  size_t c = 0;
  static_cast<PairWorkspaceLayout&>(l) = take_pair_workspace(&c, s, num_tokens);
  l.intermediate = take_workspace(&c, static_cast<size_t>(pairs * s.intermediate) * 2);
  l.partials = take_workspace(&c, partial_rows(pairs) * static_cast<size_t>(s.hidden) * sizeof(float));
  l.path = weight4_gemm_path(s, method, num_tokens);
  if (l.path == Weight4GemmPath::kStreaming) {
    l.total = c;
    return l;
  }
  if (l.path == Weight4GemmPath::kDequant) {
    l.chunk_experts = dequant_chunk_experts(s);
    const size_t per_expert = static_cast<size_t>(std::max(s.n1() * s.hidden, s.hidden * s.intermediate)) * 2;
    l.dequant = take_workspace(&c, static_cast<size_t>(l.chunk_experts) * per_expert);
    l.gemm1_scratch = take_workspace(&c, grouped_gemm_workspace_size(chunk_gemm1(s, num_tokens, l.chunk_experts)));
    l.gemm2_scratch = take_workspace(&c, grouped_gemm_workspace_size(chunk_gemm2(s, num_tokens, l.chunk_experts)));
  } else {
#if MOEKIT_HAVE_CUTLASS
    const int64_t g = weight4_group(method);
    l.bf16_scales = take_workspace(
        &c, static_cast<size_t>(s.num_experts * std::max(s.hidden / g * s.n1(), s.intermediate / g * s.hidden)) * 2);
    l.gemm1_scratch = take_workspace(&c, cutlass_weight4_grouped_gemm_workspace_size(gemm1_problem(s, num_tokens)));
    l.gemm2_scratch = take_workspace(&c, cutlass_weight4_grouped_gemm_workspace_size(gemm2_problem(s, num_tokens)));
#endif
  }
  if (s.expert_bias) l.gemm1_raw = take_workspace(&c, static_cast<size_t>(pairs * s.n1()) * 2);
  l.total = c;
  return l;
}

std::string weight4_gemm_plan(const ExpertsShape& s, QuantMethod method, int64_t num_tokens) {
  const int64_t pairs = num_tokens * s.top_k;
  const Weight4GemmPath path = weight4_gemm_path(s, method, num_tokens);
  if (path == Weight4GemmPath::kMixed) {
    const Support sup = weight4_mixed_gemm_supports(s, method);
    return std::string("4-bit (") + quant_method_name(method) + ") " +
           (sup.ok ? std::string("CUTLASS mixed-input GEMMs (int4 converted in registers, 128x") +
                         (mixed_tile(s, num_tokens) == CutlassW4Tile::kN256 ? "256" : "128") + "x64 tiles)"
                   : "mixed-input GEMMs forced, unavailable: " + sup.reason);
  }
  if (path == Weight4GemmPath::kDequant) {
    const int64_t chunk = dequant_chunk_experts(s);
    return std::string("4-bit (") + quant_method_name(method) + ") dequantized to bf16, " +
           std::to_string(chunk) + " expert(s) at a time; GEMM1 " +
           grouped_gemm_plan(chunk_gemm1(s, num_tokens, chunk)) + "; GEMM2 " +
           grouped_gemm_plan(chunk_gemm2(s, num_tokens, chunk));
  }
  const W4StreamVariant v = variant_for(s, pairs);
  return std::string("4-bit (") + quant_method_name(method) + ") streaming GEMMs " + w4_stream_variant_name(v) +
         ", GEMM2 in " + std::to_string(gemm2_of(s, method, pairs, v).k_splits) + " K slice(s)";
}

Status run_experts_weight4(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                           cudaStream_t stream) {
  const int64_t M = run.num_tokens;
  const Weight4WorkspaceLayout l = weight4_workspace_layout(s, w.method, M);
  char* ws = run.workspace;
  MOEKIT_RETURN_IF_ERROR(align_pairs(s, l, ws, M, run.topk_ids, run.expert_counts, stream));
  if (M == 0) return Status::Ok();
  FinalizeArgs fa;
  switch (l.path) {
    case Weight4GemmPath::kStreaming: MOEKIT_RETURN_IF_ERROR(run_streaming(s, w, run, l, &fa, stream)); break;
    case Weight4GemmPath::kMixed: {
      const Support sup = weight4_mixed_gemm_supports(s, w.method);
      if (!sup.ok) return Unsupported(sup.reason);
#if MOEKIT_HAVE_CUTLASS
      MOEKIT_RETURN_IF_ERROR(run_mixed(s, w, run, l, &fa, stream));
#endif
      break;
    }
    case Weight4GemmPath::kDequant: MOEKIT_RETURN_IF_ERROR(run_dequant(s, w, run, l, &fa, stream)); break;
  }
  fa.num_tokens = M;
  fa.top_k = s.top_k;
  fa.hidden = s.hidden;
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
