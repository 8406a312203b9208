#include "dispatch/topk_reduce.h"

#include "moekit/parallel_for.h"

namespace moekit::dispatch {

void weighted_topk_reduce(const float* rows, const int32_t* pair_to_row, const float* weights, int64_t num_tokens,
                          int64_t k, int64_t H, float* y) {
  parallel_for(num_tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* out = y + t * H;
      for (int64_t c = 0; c < H; ++c) out[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float w = weights[t * k + j];
        const float* src = rows + static_cast<int64_t>(pair_to_row[t * k + j]) * H;
        for (int64_t c = 0; c < H; ++c) out[c] += w * src[c];
      }
    }
  });
}

}  // namespace moekit::dispatch
