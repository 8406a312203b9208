#include "experts/cuda/moe_pipeline_fp8.h"

#ifdef MOEKIT_WITH_CUDA

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "experts/cuda/fp8_streaming_gemm.h"
#include "experts/cuda/fp8_experts.h"
#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "experts/cuda/fp8_mma_gemm.h"

namespace moekit::cuda {

#ifndef MOEKIT_HAVE_CUTLASS
// A build without the CUTLASS kernels: the mma.sync GEMM serves every target.
bool fp8_cutlass_gemm_built() { return false; }
size_t fp8_cutlass_gemm_workspace_size(int64_t) { return 0; }
Status fp8_cutlass_gemm(const Fp8GemmLaunch&, cudaStream_t) {
  return Unsupported("fp8 tensor-core GEMM: this build has no CUTLASS kernels");
}
#endif

namespace {

int64_t scale_blocks(int64_t cols) { return (cols + kFp8BlockSize - 1) / kFp8BlockSize; }

// The overrides (ExpertsShape::kernel): sm90_fp8_gemm = mma_sync | cutlass |
// streaming forces a GEMM path, sm90_fp8_stream names the streaming instance or
// turns it off, sm80_fp8_mma = e4m3 | f16 the mma.sync GEMM's operands, for
// comparisons.

// GEMM2 may cut K into slices only up to this many routed rows, as the bf16
// pipeline: the f32 partials need at most kMaxFp8StreamKSplits x this many rows of H.
constexpr int64_t kSplitMaxRows = 128;

size_t expert_out_rows(int64_t pairs) {
  return static_cast<size_t>(std::max(pairs, kMaxFp8StreamKSplits * std::min(pairs, kSplitMaxRows)));
}

// Routed pairs (M·k) up to which streaming the weights beats the tensor-core
// grouped GEMM. Measured on the H200 in one process (bench --variant
// MOEKIT_SM90_FP8_GEMM=cutlass|streaming, bench/results/): streaming wins at
// M = 1 (2-8 pairs: its four launches against the GEMM path's seven, K slices
// for few CTAs); from ~32 pairs on (M = 16) the CUTLASS kernel's deeper TMA
// pipeline wins on every shape, by 8-15%.
constexpr int64_t kStreamingMaxPairs = 8;

std::optional<Fp8StreamVariant> streaming_variant(const ExpertsShape& s, const KernelOptions& o, int64_t pairs) {
  if (s.batch_invariant) return std::nullopt;  // one path for every M: the tensor-core GEMM
  if (s.target < CudaTarget::kSm89) return std::nullopt;  // its e4m3 mma.sync needs sm_89
  if (!o.sm90_fp8_stream.empty()) {
    if (o.sm90_fp8_stream == "off") return std::nullopt;
    if (const auto v = parse_fp8_stream_variant(o.sm90_fp8_stream)) return v;
  }
  if (pairs > kStreamingMaxPairs && o.sm90_fp8_gemm != "streaming") return std::nullopt;
  // The token tile by mean rows per non-empty expert.
  const int64_t groups = std::max<int64_t>(1, std::min(s.num_experts, pairs));
  const int64_t rows = (pairs + groups - 1) / groups;
  if (rows <= 8) return Fp8StreamVariant::kW1T8K128S2;
  return rows <= 16 ? Fp8StreamVariant::kW1T16K128S2 : Fp8StreamVariant::kW1T32K256S2;
}

// The CUTLASS sm90 kernel is built and the shape's target runs it.
bool fp8_cutlass_serves(const ExpertsShape& s) { return fp8_cutlass_gemm_built() && s.target == CudaTarget::kSm90; }

// e4m3 operands where the target has the instruction (sm_89 on), unless f16 is asked for.
Fp8MmaOperands mma_operands(const ExpertsShape& s) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  return s.target >= CudaTarget::kSm89 && o.sm80_fp8_mma != "f16" ? Fp8MmaOperands::kE4m3 : Fp8MmaOperands::kF16;
}

Status tensor_core_gemm(const ExpertsShape& s, std::string_view path, const Fp8GemmLaunch& g, cudaStream_t stream) {
  return path == "cutlass" ? fp8_cutlass_gemm(g, stream) : fp8_mma_gemm(g, mma_operands(s), stream);
}

}  // namespace

const char* fp8_gemm_path_name(const ExpertsShape& s, int64_t num_tokens) {
  const KernelOptions& o = kernel_options_or_environment(s.kernel);
  const bool gemm_forced = o.sm90_fp8_gemm == "cutlass" || o.sm90_fp8_gemm == "mma_sync";
  if (!gemm_forced && streaming_variant(s, o, num_tokens * s.top_k)) return "streaming";
  if (o.sm90_fp8_gemm == "mma_sync" || !fp8_cutlass_serves(s)) {
    return mma_operands(s) == Fp8MmaOperands::kE4m3 ? "mma_sync e4m3" : "mma_sync f16";
  }
  return "cutlass";
}

bool fp8_gemm1_single_launch(const ExpertsShape& s) {
  return !s.activation.gated() || s.intermediate % kFp8BlockSize == 0;
}

int64_t fp8_w13_gemm_scale_count(const ExpertsShape& s) {
  return (s.activation.gated() ? 2 : 1) * s.num_experts * scale_blocks(s.hidden) * scale_blocks(s.intermediate);
}

Fp8WorkspaceLayout fp8_workspace_layout(const ExpertsShape& s, int64_t num_tokens) {
  const size_t pairs = static_cast<size_t>(num_tokens * s.top_k);
  const size_t H = static_cast<size_t>(s.hidden), I = static_cast<size_t>(s.intermediate);
  const size_t n1 = static_cast<size_t>(s.n1());
  Fp8WorkspaceLayout l;
  size_t c = 0;
  static_cast<PairWorkspaceLayout&>(l) = take_pair_workspace(&c, s, num_tokens);
  l.amax = take_workspace(&c, 2 * sizeof(float));
  // The stages run in turn on one stream, so buffers whose lives do not overlap
  // share bytes: GEMM1 has read its input (x_q8, or x_tokens) before the second
  // quantizer writes act_q8, so act_q8 lies in x_q8's bytes; GEMM2 writes y after
  // that quantizer has read GEMM1's output (h, or the streaming GEMM1's
  // activation act), so y lies in h's bytes, as act does.
  size_t x_end = c;
  l.x_q8 = take_workspace(&x_end, pairs * H);
  l.x_scale = take_workspace(&x_end, pairs * scale_blocks(s.hidden) * sizeof(float));
  l.act_q8 = take_workspace(&c, pairs * I);
  l.act_scale = take_workspace(&c, pairs * scale_blocks(s.intermediate) * sizeof(float));
  c = std::max(c, x_end);
  size_t h_end = c;
  l.gemm1_out = take_workspace(&h_end, pairs * n1 * sizeof(float));
  l.expert_out = take_workspace(&c, expert_out_rows(static_cast<int64_t>(pairs)) * H * sizeof(float));
  c = std::max(c, h_end);
  l.gemm_tables = take_workspace(&c, std::max(fp8_cutlass_serves(s) ? fp8_cutlass_gemm_workspace_size(s.num_experts) : 0,
                                              fp8_mma_gemm_workspace_size(s.num_experts, static_cast<int64_t>(pairs))));
  l.x_tokens = take_workspace(&c, static_cast<size_t>(num_tokens) * H);
  l.x_token_scale = take_workspace(&c, static_cast<size_t>(num_tokens) * scale_blocks(s.hidden) * sizeof(float));
  l.total = c;
  return l;
}

Status run_experts_fp8(const ExpertsShape& s, const Fp8ExpertWeights& w, const Fp8ExpertsRun& run,
                       cudaStream_t stream) {
  const int64_t M = run.num_tokens, E = s.num_experts, H = s.hidden, I = s.intermediate, n1 = s.n1();
  const int64_t pairs = M * s.top_k;
  const Fp8WorkspaceLayout l = fp8_workspace_layout(s, M);
  char* ws = run.workspace;
  auto* group_start = reinterpret_cast<int32_t*>(ws + l.group_start);  // [E]
  auto* group_rows = reinterpret_cast<int32_t*>(ws + l.group_rows);    // [E]
  auto* pair_row = reinterpret_cast<int32_t*>(ws + l.pair_row);        // [M·k]
  auto* row_token = reinterpret_cast<int32_t*>(ws + l.row_token);      // [M·k]
  auto* amax = reinterpret_cast<float*>(ws + l.amax);                  // [2]
  auto* h = reinterpret_cast<float*>(ws + l.gemm1_out);                // [M·k, n1]
  float* act = h;                                                      // [M·k, I]: the streaming GEMM1's output
  auto* y = reinterpret_cast<float*>(ws + l.expert_out);               // [M·k, H] (or its K slices)

  MOEKIT_RETURN_IF_ERROR(align_pairs(s, l, ws, M, run.topk_ids, run.expert_counts, stream));
  if (M == 0) return Status::Ok();

  // NOTE: quantized at the same two points as the cpu backend (cpu_experts.cpp).
  Fp8QuantizeArgs q1;
  q1.src = run.hidden;
  q1.src_bf16 = true;
  q1.ld = H;
  q1.row_index = row_token;
  q1.rows = pairs;
  q1.cols = H;
  q1.group_start = group_start;
  q1.group_rows = group_rows;
  q1.num_experts = E;
  Fp8QuantizeArgs q2 = q1;  // GEMM2's input: GEMM1's output, activated on the way (or the streaming epilogue's)
  q2.src = h;
  q2.src_bf16 = false;
  q2.ld = n1;
  q2.row_index = nullptr;
  q2.cols = I;
  q2.activation = true;
  q2.act = s.activation;
  const Fp8ActQuant quant1{w.quant.method, w.quant.act_scale, w.a13_scale, amax};
  const Fp8ActQuant quant2{w.quant.method, w.quant.act_scale, w.a2_scale, amax + 1};
  Fp8FinalizeArgs fa;
  fa.y = y;
  fa.pair_row = pair_row;
  fa.topk_weights = run.topk_weights;
  fa.num_tokens = M;
  fa.top_k = s.top_k;
  fa.hidden = H;
  fa.out = run.out;
  fa.skip_negative_ids = run.skip_negative_ids;
  fa.topk_ids = run.topk_ids;

  const std::string_view path = fp8_gemm_path_name(s, M);
  // GEMM1's input: with dynamic scales a token's quantized row is the same in
  // each of its k pairs, so the M token rows are quantized once (and the
  // tensor-core GEMMs get them copied to their permuted rows); static
  // per-expert scales quantize each pair.
  const bool per_token = !(w.quant.method == QuantMethod::kFp8PerTensor && w.quant.act_scale == ActScale::kStatic);
  const bool streaming = path == "streaming";
  const uint8_t* gemm1_a = reinterpret_cast<uint8_t*>(ws + l.x_q8);
  const float* gemm1_a_scale = reinterpret_cast<float*>(ws + l.x_scale);
  Fp8QuantizeArgs qx = q1;
  if (per_token) {
    qx.row_index = nullptr;
    qx.rows = M;
    qx.group_start = qx.group_rows = nullptr;
    qx.dst_q = reinterpret_cast<uint8_t*>(ws + l.x_tokens);
    qx.dst_scale = reinterpret_cast<float*>(ws + l.x_token_scale);
    qx.scales_by_row = true;
  } else {
    qx.dst_q = reinterpret_cast<uint8_t*>(ws + l.x_q8);
    qx.dst_scale = reinterpret_cast<float*>(ws + l.x_scale);
    qx.scales_by_row = streaming;
  }
  MOEKIT_RETURN_IF_ERROR(fp8_quantize_rows(qx, quant1, stream));
  if (per_token && !streaming) {
    Fp8GatherArgs ga;
    ga.src_q = qx.dst_q;
    ga.src_scale = qx.dst_scale;
    ga.row_index = row_token;
    ga.rows = pairs;
    ga.cols = H;
    ga.dst_q = reinterpret_cast<uint8_t*>(ws + l.x_q8);
    ga.dst_scale = reinterpret_cast<float*>(ws + l.x_scale);
    ga.group_start = group_start;
    ga.group_rows = group_rows;
    ga.num_experts = E;
    MOEKIT_RETURN_IF_ERROR(fp8_gather_rows(ga, stream));
  }
  if (per_token && streaming) {  // the streaming GEMM gathers the token rows itself
    gemm1_a = qx.dst_q;
    gemm1_a_scale = qx.dst_scale;
  }
  q2.dst_q = reinterpret_cast<uint8_t*>(ws + l.act_q8);
  q2.dst_scale = reinterpret_cast<float*>(ws + l.act_scale);
  q2.scales_by_row = streaming;
  if (streaming) {
    const Fp8StreamVariant v = *streaming_variant(s, kernel_options_or_environment(s.kernel), pairs);
    Fp8StreamGemm g1;
    g1.method = w.quant.method;
    g1.num_groups = E;
    g1.n = n1;
    g1.k = H;
    g1.parts = s.activation.gated() ? 2 : 1;
    g1.max_rows = pairs;
    g1.activation = true;  // writes the f32 activation: q2 then reads it as it is
    g1.act = s.activation;
    g1.a = gemm1_a;
    g1.a_row_index = per_token ? row_token : nullptr;
    g1.a_scale = gemm1_a_scale;
    g1.b = w.w13;
    g1.b_scale = w.w13_scale;
    g1.c = act;
    g1.group_start = group_start;
    g1.group_rows = group_rows;
    MOEKIT_RETURN_IF_ERROR(fp8_streaming_gemm(g1, v, stream));
    q2.src = act;
    q2.ld = I;
    q2.activation = false;
    MOEKIT_RETURN_IF_ERROR(fp8_quantize_rows(q2, quant2, stream));
    Fp8StreamGemm g2 = g1;
    g2.n = H;
    g2.k = I;
    g2.parts = 1;
    g2.activation = false;
    g2.a = q2.dst_q;
    g2.a_row_index = nullptr;
    g2.a_scale = q2.dst_scale;
    g2.b = w.w2;
    g2.b_scale = w.w2_scale;
    g2.c = y;
    if (pairs <= kSplitMaxRows) {
      g2.k_splits = fp8_streaming_k_splits(g2, v, current_sm_count());
      g2.c_split_stride = pairs * H;
    }
    MOEKIT_RETURN_IF_ERROR(fp8_streaming_gemm(g2, v, stream));
    fa.k_splits = g2.k_splits;
    fa.split_stride = g2.c_split_stride;
    return fp8_finalize(fa, stream);
  }
  // The tensor-core grouped GEMMs: GEMM1 once over all N1 rows where the parts
  // are whole scale blocks; else per row part of W13 (gate, up), each with its
  // own scales, so that no 128-row scale block straddles the two whatever I is.
  const bool single = fp8_gemm1_single_launch(s);
  const int64_t parts = single ? 1 : 2;
  Fp8GemmLaunch g1;
  g1.num_groups = static_cast<int>(E);
  g1.n = static_cast<int>(n1 / parts);
  g1.k = static_cast<int>(H);
  g1.a = gemm1_a;
  g1.a_scale = gemm1_a_scale;
  g1.b_group_stride = n1 * H;
  g1.ldd = static_cast<int>(n1);
  g1.group_start = group_start;
  g1.group_rows = group_rows;
  g1.max_rows = pairs;
  g1.workspace = ws + l.gemm_tables;
  g1.mean_group_rows = pairs / E;
  g1.batch_invariant = s.batch_invariant;
  g1.kernel = s.kernel;
  for (int64_t p = 0; p < parts; ++p) {
    g1.b = w.w13 + p * I * H;
    g1.b_scale = w.w13_gemm_scale + p * E * scale_blocks(H) * scale_blocks(I);
    g1.d = h + p * I;
    MOEKIT_RETURN_IF_ERROR(tensor_core_gemm(s, path, g1, stream));
  }
  MOEKIT_RETURN_IF_ERROR(fp8_quantize_rows(q2, quant2, stream));
  Fp8GemmLaunch g2 = g1;
  g2.n = static_cast<int>(H);
  g2.k = static_cast<int>(I);
  g2.a = q2.dst_q;
  g2.a_scale = q2.dst_scale;
  g2.b = w.w2;
  g2.b_group_stride = H * I;
  g2.b_scale = w.w2_gemm_scale;
  g2.d = y;
  g2.ldd = static_cast<int>(H);
  MOEKIT_RETURN_IF_ERROR(tensor_core_gemm(s, path, g2, stream));
  return fp8_finalize(fa, stream);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
