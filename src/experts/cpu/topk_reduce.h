// The weighted top-k reduce that ends the CPU experts stage, in its one fixed
// order. NOTE: the expert-parallel finalize (src/dispatch/ep_*) calls this same
// function on rows that came back from other ranks; sharing it is what keeps an
// EP layer's output bitwise equal to the single-rank layer's.
#pragma once

#include <cstdint>

namespace moekit::cpu {

// y[t] = sum over j = 0..k-1, in this order, of weights[t, j] * rows[pair_to_row[t*k + j]],
// fp32 accumulation from 0. rows: [*, H] f32; pair_to_row: [M * k] i32;
// weights: [M, k] f32; y: [M, H] f32, every element written.
void weighted_topk_reduce(const float* rows, const int32_t* pair_to_row, const float* weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, float* y);

}  // namespace moekit::cpu
