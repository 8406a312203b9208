// Alignment of routed token rows by expert, on the device (the "permute" of
// the modular pipeline): a deterministic counting sort of the M·k (token,
// slot) pairs by expert id. Within an expert, pairs keep ascending pair order
// (token, then slot), so the permutation never depends on timing.
//
// Three launches: per-chunk histogram (integer atomics: order-free) -> one
// block scans chunks and experts into each expert's first row -> one warp per
// chunk assigns rows in pair order; up to 1024 pairs all of it in one launch
// (decode sizes, where launches cost more than the work). No host synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "moekit/status.h"

namespace moekit::cuda {

struct AlignProblem {
  int64_t num_tokens = 0;   // M
  int64_t top_k = 0;        // k
  int64_t num_experts = 0;  // E
  int64_t num_pairs() const { return num_tokens * top_k; }
};

struct AlignArgs {
  const int32_t* topk_ids = nullptr;  // [M, k] i32; ids outside [0, E) get no row (pair_row = -1)
  int32_t* group_start = nullptr;     // [E] i32 out: first permuted row of each expert
  int32_t* group_rows = nullptr;      // [E] i32 out: rows (pairs) routed to each expert
  int32_t* pair_row = nullptr;        // [M*k] i32 out: permuted row of pair t*k+j, or -1
  int32_t* row_token = nullptr;       // [M*k] i32 out: token of each permuted row; rows past the valid count undefined
  int32_t* expert_counts = nullptr;   // [E] i32 out, optional: a copy of group_rows
  void* workspace = nullptr;          // >= align_workspace_size(max pairs, E) bytes
};

// Scratch for per-chunk counts; sized by the largest M·k the caller will pass.
size_t align_workspace_size(int64_t max_pairs, int64_t num_experts);

Status align_by_expert(const AlignProblem& problem, const AlignArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda
