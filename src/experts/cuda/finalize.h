// Finalize of the local (single-rank) modular pipeline: applies the top-k
// weights and reduces each token's k expert outputs in slot order (fp32, one
// thread per 8 output columns): deterministic, no atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/status.h"

namespace moekit::cuda {

struct FinalizeArgs {
  int64_t num_tokens = 0;             // M
  int64_t top_k = 0;                  // k
  int64_t hidden = 0;                 // H, a multiple of 8
  const uint16_t* expert_out = nullptr;  // [rows, H] bf16 bits: the expert output of each permuted row
  // Instead of expert_out: [k_splits, partial_rows, H] f32 partial sums of the expert
  // output over K slices; a row's output is their sum in slice order, rounded to bf16.
  const float* expert_partials = nullptr;
  int64_t k_splits = 1;
  int64_t partial_rows = 0;
  const int32_t* pair_row = nullptr;     // [M, k] i32: permuted row of each (token, slot), -1 = invalid id
  const float* topk_weights = nullptr;   // [M, k] f32
  uint16_t* out = nullptr;               // [M, H] bf16 bits, every element written
  // Optional extras (expert_extras.h):
  const int32_t* topk_ids = nullptr;     // [M, k] i32, required with w2_bias or skip_negative_ids: each slot's expert
  const float* w2_bias = nullptr;        // [E, H] f32: each expert row gets + w2_bias[e] before weighting
  const uint16_t* shared_out = nullptr;  // [M, H] bf16 bits: the shared expert's output, added last
  const float* shared_gate = nullptr;    // [M] f32, optional with shared_out: its per-token scale
  // A negative id contributes nothing (expert parallelism: computed on another
  // rank) instead of making the token's row NaN.
  bool skip_negative_ids = false;
};

// out[t, :] = sum_j w[t, j] * (expert_out[pair_row[t, j], :] + w2_bias[ids[t, j], :]), j ascending
// (with partials, expert_out[r] = bf16(sum_s partials[s, r]), s ascending), then
// + shared_gate[t] * shared_out[t, :] (gate 1 when absent). A pair without a row
// (an id outside [0, E)) makes the token's row NaN; with skip_negative_ids a
// negative id is left out of the sum instead (a token with none left gets 0).
Status finalize_weighted_sum(const FinalizeArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda
