// Groups the (token, slot) pairs of a routed batch by expert, so that each
// expert runs one GEMM over a contiguous block of rows.
#pragma once

#include <cstdint>

namespace moekit::cpu {

// Views into caller-owned memory (the kernel's workspace).
struct ExpertPermutation {
  int32_t* expert_offsets = nullptr;  // [E + 1] i32: expert e owns permuted rows [offsets[e], offsets[e+1])
  int32_t* row_to_pair = nullptr;     // [M * k] i32: pair index t*k + j of each permuted row
  int32_t* pair_to_row = nullptr;     // [M * k] i32: permuted row of each pair (inverse of row_to_pair)
};

// Counting sort of the pairs by expert id, stable: within one expert, rows are
// in ascending (token, slot) order. ids: [M, k] i32, every id in [0, E) (the
// caller has validated them).
void build_permutation(const int32_t* ids, int64_t num_tokens, int64_t top_k, int64_t num_experts,
                       const ExpertPermutation& perm);

}  // namespace moekit::cpu
