#include "experts/cuda/moe_pipeline.h"

#ifdef MOEKIT_WITH_CUDA

#include <algorithm>
#include <sstream>

#include "core/cuda_check.h"
#include "experts/cuda/align.h"
#include "experts/cuda/expert_extras.h"
#include "experts/cuda/finalize.h"

namespace moekit::cuda {

namespace {
constexpr size_t kAlign = 256;
// GEMM2 may cut K into slices (grouped_gemm_k_splits) only up to this many routed
// rows: the f32 partials then need at most kMaxKSplits x this many rows of H,
// a bound that grows with M, so the workspace sized for max_num_tokens holds any M.
constexpr int64_t kSplitMaxRows = 128;
constexpr int64_t kMaxKSplits = 8;  // as sm90::kMaxStreamKSplits; the pipeline does not depend on the kernels

size_t split_partial_rows(int64_t pairs) { return static_cast<size_t>(kMaxKSplits * std::min(pairs, kSplitMaxRows)); }
}  // namespace

int current_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

size_t take_workspace(size_t* cursor, size_t bytes) {
  const size_t at = *cursor;
  *cursor += (bytes + kAlign - 1) / kAlign * kAlign;
  return at;
}

PairWorkspaceLayout take_pair_workspace(size_t* cursor, const ExpertsShape& s, int64_t num_tokens) {
  const size_t pairs = static_cast<size_t>(num_tokens * s.top_k);
  const size_t E = static_cast<size_t>(s.num_experts);
  PairWorkspaceLayout l;
  l.topk_ids = take_workspace(cursor, pairs * sizeof(int32_t));
  l.topk_weights = take_workspace(cursor, pairs * sizeof(float));
  l.group_start = take_workspace(cursor, E * sizeof(int32_t));
  l.group_rows = take_workspace(cursor, E * sizeof(int32_t));
  l.pair_row = take_workspace(cursor, pairs * sizeof(int32_t));
  l.row_token = take_workspace(cursor, pairs * sizeof(int32_t));
  l.align_scratch = take_workspace(cursor, align_workspace_size(static_cast<int64_t>(pairs), s.num_experts));
  return l;
}

Status align_pairs(const ExpertsShape& s, const PairWorkspaceLayout& l, char* workspace, int64_t num_tokens,
                   const int32_t* topk_ids, int32_t* expert_counts, cudaStream_t stream) {
  AlignArgs aa;
  aa.topk_ids = topk_ids;
  aa.group_start = reinterpret_cast<int32_t*>(workspace + l.group_start);
  aa.group_rows = reinterpret_cast<int32_t*>(workspace + l.group_rows);
  aa.pair_row = reinterpret_cast<int32_t*>(workspace + l.pair_row);
  aa.row_token = reinterpret_cast<int32_t*>(workspace + l.row_token);
  aa.expert_counts = expert_counts;
  aa.workspace = workspace + l.align_scratch;
  return align_by_expert(AlignProblem{num_tokens, s.top_k, s.num_experts}, aa, stream);
}

GroupedGemmProblem gemm1_problem(const ExpertsShape& s, int64_t num_tokens) {
  GroupedGemmProblem p;
  p.num_groups = s.num_experts;
  p.max_rows = num_tokens * s.top_k;
  p.a_rows = num_tokens;
  p.n = s.n1();
  p.k = s.hidden;
  p.scratch_rows = std::max(num_tokens, s.max_num_tokens) * s.top_k;
  p.out_dtype = DType::kBF16;
  p.gather_a = true;
  p.gather_room = true;  // run_experts lends expert_out, which GEMM2 fills only later
  // With a gate/up bias the activation needs the biased sum: it runs in its
  // own pass (bias_activation) over GEMM1's plain output.
  p.epilogue = s.expert_bias ? GemmEpilogue::kNone : GemmEpilogue::kActivation;
  p.activation = s.activation;
  p.batch_invariant = s.batch_invariant;
  p.target = s.target;
  p.kernel = s.kernel;
  return p;
}

GroupedGemmProblem shared_gemm1_problem(const ExpertsShape& s, int64_t num_tokens) {
  GroupedGemmProblem p;
  p.num_groups = 1;
  p.max_rows = num_tokens;
  p.a_rows = num_tokens;
  p.n = s.shared_n1();
  p.k = s.hidden;
  p.scratch_rows = std::max(num_tokens, s.max_num_tokens);
  p.out_dtype = DType::kBF16;
  p.epilogue = GemmEpilogue::kActivation;
  p.activation = s.activation;
  p.batch_invariant = s.batch_invariant;
  p.target = s.target;
  p.kernel = s.kernel;
  return p;
}

GroupedGemmProblem shared_gemm2_problem(const ExpertsShape& s, int64_t num_tokens) {
  GroupedGemmProblem p;
  p.num_groups = 1;
  p.max_rows = num_tokens;
  p.a_rows = num_tokens;
  p.n = s.hidden;
  p.k = s.shared_intermediate;
  p.out_dtype = DType::kBF16;
  p.epilogue = GemmEpilogue::kNone;
  p.batch_invariant = s.batch_invariant;
  p.target = s.target;
  p.kernel = s.kernel;
  return p;
}

GroupedGemmProblem gemm2_problem_of_forward(const ExpertsShape& s, int64_t num_tokens) {
  // Few routed rows: GEMM2 may stream K in slices (f32 partials, added in finalize).
  GroupedGemmProblem p2 = gemm2_problem(s, num_tokens);
  if (p2.max_rows <= kSplitMaxRows && !p2.batch_invariant) {  // K slices would make the sum order depend on M
    const int64_t splits = std::min(kMaxKSplits, grouped_gemm_k_splits(p2));
    if (splits > 1) {
      p2.out_dtype = DType::kF32;
      p2.k_splits = splits;
    }
  }
  return p2;
}

std::string experts_gemm_plan(const ExpertsShape& s, int64_t num_tokens) {
  std::string plan = "gemm1 " + grouped_gemm_plan(gemm1_problem(s, num_tokens)) + "; gemm2 " +
                     grouped_gemm_plan(gemm2_problem_of_forward(s, num_tokens));
  if (s.shared_intermediate > 0) {
    plan += "; shared gemm1 " + grouped_gemm_plan(shared_gemm1_problem(s, num_tokens)) + "; shared gemm2 " +
            grouped_gemm_plan(shared_gemm2_problem(s, num_tokens));
  }
  return plan;
}

GroupedGemmProblem gemm2_problem(const ExpertsShape& s, int64_t num_tokens) {
  GroupedGemmProblem p;
  p.num_groups = s.num_experts;
  p.max_rows = num_tokens * s.top_k;
  p.a_rows = p.max_rows;
  p.n = s.hidden;
  p.k = s.intermediate;
  p.out_dtype = DType::kBF16;
  p.gather_a = false;
  p.epilogue = GemmEpilogue::kNone;
  p.batch_invariant = s.batch_invariant;
  p.target = s.target;
  p.kernel = s.kernel;
  return p;
}

ExpertsWorkspaceLayout experts_workspace_layout(const ExpertsShape& s, int64_t num_tokens) {
  const size_t pairs = static_cast<size_t>(num_tokens * s.top_k);
  ExpertsWorkspaceLayout l;
  size_t c = 0;
  static_cast<PairWorkspaceLayout&>(l) = take_pair_workspace(&c, s, num_tokens);
  l.gemm1_scratch = take_workspace(&c, grouped_gemm_workspace_size(gemm1_problem(s, num_tokens)));
  l.gemm2_scratch = take_workspace(&c, grouped_gemm_workspace_size(gemm2_problem(s, num_tokens)));
  l.intermediate = take_workspace(&c, pairs * static_cast<size_t>(s.intermediate) * 2);
  // bf16 GEMM2 rows, or the f32 partial sums of its K slices.
  l.expert_out = take_workspace(&c, std::max(pairs * 2, split_partial_rows(static_cast<int64_t>(pairs)) * 4) *
                              static_cast<size_t>(s.hidden));
  if (s.expert_bias) l.gemm1_raw = take_workspace(&c, pairs * static_cast<size_t>(s.n1()) * 2);
  static_cast<SharedWorkspaceLayout&>(l) = take_shared_workspace(&c, s, num_tokens);
  l.total = c;
  return l;
}

SharedWorkspaceLayout take_shared_workspace(size_t* cursor, const ExpertsShape& s, int64_t num_tokens) {
  SharedWorkspaceLayout l;
  if (s.shared_intermediate == 0) return l;
  const size_t M = static_cast<size_t>(num_tokens), H = static_cast<size_t>(s.hidden);
  l.shared_group = take_workspace(cursor, 2 * sizeof(int32_t));
  l.shared_scratch1 = take_workspace(cursor, grouped_gemm_workspace_size(shared_gemm1_problem(s, num_tokens)));
  l.shared_scratch2 = take_workspace(cursor, grouped_gemm_workspace_size(shared_gemm2_problem(s, num_tokens)));
  l.shared_inter = take_workspace(cursor, M * static_cast<size_t>(s.shared_intermediate) * 2);
  l.shared_out = take_workspace(cursor, M * H * 2);
  if (s.shared_gate) l.shared_gate = take_workspace(cursor, M * sizeof(float));
  return l;
}

std::string ExpertsWorkspaceLayout::to_string() const {
  std::ostringstream os;
  os << "{ids@" << topk_ids << ", weights@" << topk_weights << ", group_start@" << group_start << ", group_rows@"
     << group_rows << ", pair_row@" << pair_row << ", row_token@" << row_token << ", align@" << align_scratch
     << ", gemm1@" << gemm1_scratch << ", gemm2@" << gemm2_scratch << ", intermediate@" << intermediate
     << ", expert_out@" << expert_out << ", total=" << total << " B}";
  return os.str();
}

// GEMM1 (activation epilogue) and GEMM2 as one-group grouped GEMMs, then the gate scores.
Status run_shared_expert(const ExpertsShape& s, const ExpertsRun& run, const SharedWorkspaceLayout& l,
                         cudaStream_t stream) {
  const int64_t M = run.num_tokens;
  char* ws = run.workspace;
  auto* group = reinterpret_cast<int32_t*>(ws + l.shared_group);  // [2]: start, rows
  MOEKIT_RETURN_IF_ERROR(write_single_group(group, group + 1, M, stream));
  GroupedGemmArgs g1;
  g1.a = run.hidden;
  g1.b = run.shared_w13;
  g1.c = ws + l.shared_inter;
  g1.group_start = group;
  g1.group_rows = group + 1;
  g1.workspace = ws + l.shared_scratch1;
  MOEKIT_RETURN_IF_ERROR(grouped_gemm(shared_gemm1_problem(s, M), g1, stream));
  GroupedGemmArgs g2;
  g2.a = reinterpret_cast<const uint16_t*>(ws + l.shared_inter);
  g2.b = run.shared_w2;
  g2.c = ws + l.shared_out;
  g2.group_start = group;
  g2.group_rows = group + 1;
  g2.workspace = ws + l.shared_scratch2;
  MOEKIT_RETURN_IF_ERROR(grouped_gemm(shared_gemm2_problem(s, M), g2, stream));
  if (s.shared_gate) {
    MOEKIT_RETURN_IF_ERROR(shared_gate_scores(run.hidden, run.shared_gate, M, s.hidden,
                                              reinterpret_cast<float*>(ws + l.shared_gate), stream));
  }
  return Status::Ok();
}

Status fork_shared_expert(const ExpertsShape& s, const ExpertsRun& run, cudaStream_t stream) {
  if (!s.shared_overlap || s.shared_intermediate == 0 || run.num_tokens == 0) return Status::Ok();
  if (run.shared_side == nullptr) return Internal("fork_shared_expert: shared_overlap without a side stream");
  const SharedExpertSide& side = *run.shared_side;
  MOEKIT_CUDA_CHECK(cudaEventRecord(side.fork, stream));
  MOEKIT_CUDA_CHECK(cudaStreamWaitEvent(side.stream, side.fork, 0));
  MOEKIT_RETURN_IF_ERROR(run_shared_expert(s, run, experts_workspace_layout(s, run.num_tokens), side.stream));
  MOEKIT_CUDA_CHECK(cudaEventRecord(side.join, side.stream));
  return Status::Ok();
}

Status run_experts(const ExpertsShape& s, const ExpertsRun& run, cudaStream_t stream) {
  const int64_t M = run.num_tokens;
  if (s.shared_overlap && s.shared_intermediate > 0 && run.shared_side == nullptr) {
    return Internal("run_experts: shared_overlap without a side stream");
  }
  const ExpertsWorkspaceLayout l = experts_workspace_layout(s, M);
  char* ws = run.workspace;
  auto* group_start = reinterpret_cast<int32_t*>(ws + l.group_start);  // [E]
  auto* group_rows = reinterpret_cast<int32_t*>(ws + l.group_rows);    // [E]
  auto* pair_row = reinterpret_cast<int32_t*>(ws + l.pair_row);        // [M·k]
  auto* row_token = reinterpret_cast<int32_t*>(ws + l.row_token);      // [M·k]
  auto* inter = reinterpret_cast<uint16_t*>(ws + l.intermediate);      // [M·k, I] bf16
  auto* y = reinterpret_cast<uint16_t*>(ws + l.expert_out);            // [M·k, H] bf16

  MOEKIT_RETURN_IF_ERROR(align_pairs(s, l, ws, M, run.topk_ids, run.expert_counts, stream));
  if (M == 0) return Status::Ok();

  GroupedGemmArgs g1;
  g1.a = run.hidden;
  g1.a_row_index = row_token;
  g1.b = run.w13;
  g1.c = s.expert_bias ? static_cast<void*>(ws + l.gemm1_raw) : inter;
  g1.group_start = group_start;
  g1.group_rows = group_rows;
  g1.gather_room = y;  // [M·k, H] bf16 at least: GEMM1's gathered rows fit (K = H)
  g1.workspace = ws + l.gemm1_scratch;
  MOEKIT_RETURN_IF_ERROR(grouped_gemm(gemm1_problem(s, M), g1, stream));
  if (s.expert_bias) {
    BiasActivationArgs ba;
    ba.max_rows = M * s.top_k;
    ba.num_groups = s.num_experts;
    ba.n1 = s.n1();
    ba.intermediate = s.intermediate;
    ba.activation = s.activation;
    ba.gemm1_out = reinterpret_cast<const uint16_t*>(ws + l.gemm1_raw);
    ba.bias = run.w13_bias;
    ba.group_start = group_start;
    ba.group_rows = group_rows;
    ba.inter = inter;
    MOEKIT_RETURN_IF_ERROR(bias_activation(ba, stream));
  }

  GroupedGemmProblem p2 = gemm2_problem_of_forward(s, M);
  GroupedGemmArgs g2;
  g2.a = inter;
  g2.b = run.w2;
  g2.c = y;
  g2.group_start = group_start;
  g2.group_rows = group_rows;
  g2.workspace = ws + l.gemm2_scratch;
  MOEKIT_RETURN_IF_ERROR(grouped_gemm(p2, g2, stream));

  FinalizeArgs fa;
  fa.num_tokens = M;
  fa.top_k = s.top_k;
  fa.hidden = s.hidden;
  if (p2.k_splits > 1) {
    fa.expert_partials = reinterpret_cast<const float*>(y);
    fa.k_splits = p2.k_splits;
    fa.partial_rows = p2.max_rows;
  } else {
    fa.expert_out = y;
  }
  fa.pair_row = pair_row;
  fa.topk_weights = run.topk_weights;
  fa.out = run.out;
  fa.skip_negative_ids = run.skip_negative_ids;
  if (run.skip_negative_ids) fa.topk_ids = run.topk_ids;
  if (s.expert_bias) {
    fa.topk_ids = run.topk_ids;
    fa.w2_bias = run.w2_bias;
  }
  if (s.shared_intermediate > 0) {
    if (s.shared_overlap) {
      MOEKIT_CUDA_CHECK(cudaStreamWaitEvent(stream, run.shared_side->join, 0));  // forked by fork_shared_expert
    } else {
      MOEKIT_RETURN_IF_ERROR(run_shared_expert(s, run, l, stream));
    }
    fa.shared_out = reinterpret_cast<const uint16_t*>(ws + l.shared_out);
    if (s.shared_gate) fa.shared_gate = reinterpret_cast<const float*>(ws + l.shared_gate);
  }
  return finalize_weighted_sum(fa, stream);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
