// The weighted top-k reduce of a finalize on the host, in its one fixed order:
// the CPU experts stage (local finalize) and the expert-parallel finalize (on
// rows that came back from other ranks) both end with it. NOTE: sharing this
// one function is what keeps an EP layer's output bitwise equal to the
// single-rank layer's.
#pragma once

#include <cstdint>

namespace moekit::dispatch {

// y[t] = sum over j = 0..k-1, in this order, of weights[t, j] * rows[pair_to_row[t*k + j]],
// fp32 accumulation from 0. rows: [*, H] f32; pair_to_row: [M * k] i32;
// weights: [M, k] f32; y: [M, H] f32, every element written.
void weighted_topk_reduce(const float* rows, const int32_t* pair_to_row, const float* weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, float* y);

}  // namespace moekit::dispatch
