// The expert stages shared by Sm90Modular and Sm90Monolithic (so the two give
// bitwise-equal outputs for the same ids and weights): align by expert ->
// grouped GEMM1 with the activation in its epilogue -> grouped GEMM2 ->
// weighted top-k reduction. Everything is enqueued on the caller's stream (the
// shared expert optionally on a side stream, forked and joined by events), in
// the caller's workspace, with no allocation and no host synchronization.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "experts/cuda/grouped_gemm.h"
#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

struct ExpertsShape {
  int64_t num_experts = 0;   // E
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int64_t top_k = 0;         // k
  ActivationConfig activation;
  bool expert_bias = false;          // w13_bias/w2_bias: GEMM1 unfused, bias + activation in their own pass
  int64_t shared_intermediate = 0;   // Is > 0: a shared expert, run as a one-group grouped GEMM pair
  bool shared_gate = false;          // shared output scaled by sigmoid(x . gate)
  bool batch_invariant = false;  // GEMM problems get it: one path for every M, no K slices
  CudaTarget target = CudaTarget::kSm90;  // the GEMM paths the device and backend offer (GEMM problems get it)
  bool shared_overlap = false;   // the shared expert on a side stream (ExpertsRun::shared_side)
  // The workspace is sized for this many tokens: a forward of fewer may give its
  // GEMMs' scratch the room (GroupedGemmProblem::scratch_rows). 0: the forward's own M.
  int64_t max_num_tokens = 0;
  const KernelOptions* kernel = nullptr;  // the GEMM problems' overrides (GroupedGemmProblem::kernel)
  int64_t n1() const { return activation.gated() ? 2 * intermediate : intermediate; }  // GEMM1 N
  int64_t shared_n1() const { return activation.gated() ? 2 * shared_intermediate : shared_intermediate; }
};

// The GEMM problems of one forward of M tokens (rows = M·k permuted pairs).
GroupedGemmProblem gemm1_problem(const ExpertsShape& s, int64_t num_tokens);
GroupedGemmProblem gemm2_problem(const ExpertsShape& s, int64_t num_tokens);
// GEMM2 as run_experts runs it: with K slices where few routed rows would leave the GPU idle.
GroupedGemmProblem gemm2_problem_of_forward(const ExpertsShape& s, int64_t num_tokens);
// The GEMM paths run_experts takes for M tokens and why (grouped_gemm_plan of each GEMM).
std::string experts_gemm_plan(const ExpertsShape& s, int64_t num_tokens);
// The shared expert's GEMMs: one group of M rows (only when s.shared_intermediate > 0).
GroupedGemmProblem shared_gemm1_problem(const ExpertsShape& s, int64_t num_tokens);
GroupedGemmProblem shared_gemm2_problem(const ExpertsShape& s, int64_t num_tokens);

// The current device's SM count (0 when it cannot be asked): what K-slice
// choices size their grids by.
int current_sm_count();

// Reserves `bytes` at *cursor, rounded up to 256 bytes; returns their offset.
size_t take_workspace(size_t* cursor, size_t bytes);

// The buffers every expert pipeline (bf16 and fp8) starts its workspace with:
// the routed pairs and their alignment by expert. Byte offsets, 256-byte aligned.
struct PairWorkspaceLayout {
  size_t topk_ids = 0;       // [M, k] i32      (monolithic: the router's ids)
  size_t topk_weights = 0;   // [M, k] f32      (monolithic: the router's weights)
  size_t group_start = 0;    // [E] i32
  size_t group_rows = 0;     // [E] i32
  size_t pair_row = 0;       // [M·k] i32
  size_t row_token = 0;      // [M·k] i32
  size_t align_scratch = 0;  // align_workspace_size(M·k, E)
};
// Lays those buffers out from *cursor on.
PairWorkspaceLayout take_pair_workspace(size_t* cursor, const ExpertsShape& s, int64_t num_tokens);
// The first stage of both pipelines: the M·k (token, slot) pairs of topk_ids
// grouped by expert into the buffers of `l` (align.h); expert_counts optional.
Status align_pairs(const ExpertsShape& s, const PairWorkspaceLayout& l, char* workspace, int64_t num_tokens,
                   const int32_t* topk_ids, int32_t* expert_counts, cudaStream_t stream);

// The shared expert's buffers (only when s.shared_intermediate > 0; size 0 otherwise).
struct SharedWorkspaceLayout {
  size_t shared_group = 0;     // [2] i32: the shared GEMMs' one group (start, rows)
  size_t shared_scratch1 = 0;  // grouped_gemm_workspace_size(shared_gemm1)
  size_t shared_scratch2 = 0;  // grouped_gemm_workspace_size(shared_gemm2)
  size_t shared_inter = 0;     // [M, Is] bf16
  size_t shared_out = 0;       // [M, H] bf16
  size_t shared_gate = 0;      // [M] f32
};
// Lays those buffers out from *cursor on.
SharedWorkspaceLayout take_shared_workspace(size_t* cursor, const ExpertsShape& s, int64_t num_tokens);

// Byte offsets of every buffer in the workspace for M tokens; each 256-byte aligned.
struct ExpertsWorkspaceLayout : PairWorkspaceLayout, SharedWorkspaceLayout {
  size_t gemm1_scratch = 0;  // grouped_gemm_workspace_size(gemm1)
  size_t gemm2_scratch = 0;  // grouped_gemm_workspace_size(gemm2)
  size_t intermediate = 0;   // [M·k, I] bf16: act(GEMM1) per permuted row
  size_t expert_out = 0;     // [M·k, H] bf16: GEMM2 per permuted row
  // Only with the extras (size 0 otherwise):
  size_t gemm1_raw = 0;      // [M·k, N1] bf16: GEMM1 before bias and activation (expert_bias)
  size_t total = 0;          // bytes
  std::string to_string() const;
};
ExpertsWorkspaceLayout experts_workspace_layout(const ExpertsShape& s, int64_t num_tokens);

// The shared expert's own stream and the two events that fork it from the
// caller's stream and join it back. The kernel object creates them once, so a
// forward allocates nothing, and event edges keep it capturable in a CUDA graph.
// NOTE: the shared expert's buffers (shared_* in ExpertsWorkspaceLayout) are
// disjoint from every buffer of the routed path, which runs at the same time.
struct SharedExpertSide {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;  // recorded on the caller's stream; the side stream waits for it
  cudaEvent_t join = nullptr;  // recorded on the side stream; the finalize waits for it
};

// Device pointers of one forward.
struct ExpertsRun {
  int64_t num_tokens = 0;              // M
  const uint16_t* hidden = nullptr;    // [M, H] bf16
  const uint16_t* w13 = nullptr;       // [E, N1, H] bf16, prepared layout (weight_layout.h)
  const uint16_t* w2 = nullptr;        // [E, H, I] bf16
  const int32_t* topk_ids = nullptr;   // [M, k] i32
  const float* topk_weights = nullptr;  // [M, k] f32
  uint16_t* out = nullptr;             // [M, H] bf16, every element written
  int32_t* expert_counts = nullptr;    // [E] i32, optional
  char* workspace = nullptr;           // >= experts_workspace_layout(s, M).total bytes
  // The extras, iff the shape asks for them:
  const float* w13_bias = nullptr;       // [E, N1] f32, prepared column order (weight_layout.h)
  const float* w2_bias = nullptr;        // [E, H] f32
  const uint16_t* shared_w13 = nullptr;  // [N1s, H] bf16, prepared layout
  const uint16_t* shared_w2 = nullptr;   // [H, Is] bf16
  const float* shared_gate = nullptr;    // [H] f32
  // iff s.shared_overlap: where fork_shared_expert put the shared expert; run_experts joins it.
  const SharedExpertSide* shared_side = nullptr;
  // Expert parallelism (MoeRunArgs::skip_negative_ids): a negative id
  // contributes nothing instead of making the token's row NaN.
  bool skip_negative_ids = false;
};

// s.shared_overlap: forks run.shared_side from `stream` and enqueues the shared
// expert there. Call it first in the forward (before routing), then run_experts
// on the same stream, which joins before the finalize. No-op otherwise or when M = 0.
Status fork_shared_expert(const ExpertsShape& s, const ExpertsRun& run, cudaStream_t stream);

Status run_experts(const ExpertsShape& s, const ExpertsRun& run, cudaStream_t stream);

// The shared expert alone on run.num_tokens tokens (run.hidden, run.shared_*,
// run.workspace laid out by `l`): its bf16 output at l.shared_out and, with a
// gate, the gate scores at l.shared_gate, which finalize adds as g * out in
// fp32. Expert-parallel GPU ranks run it on their own tokens.
Status run_shared_expert(const ExpertsShape& s, const ExpertsRun& run, const SharedWorkspaceLayout& l,
                         cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
