#include "experts/cpu/permute.h"

#include <algorithm>

namespace moekit::cpu {

void build_permutation(const int32_t* ids, int64_t num_tokens, int64_t top_k, int64_t num_experts,
                       const ExpertPermutation& perm) {
  const int64_t pairs = num_tokens * top_k;
  int32_t* offsets = perm.expert_offsets;
  std::fill(offsets, offsets + num_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) ++offsets[ids[p] + 1];
  for (int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  // One sequential pass in pair order keeps each expert's rows stable; offsets[e]
  // serves as expert e's fill cursor and is restored afterwards.
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    const int32_t row = offsets[e]++;
    perm.row_to_pair[row] = static_cast<int32_t>(p);
    perm.pair_to_row[p] = row;
  }
  // offsets[e] now holds the end of expert e, i.e. the start of e + 1: shift back.
  for (int64_t e = num_experts; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

}  // namespace moekit::cpu
