// The K-slice rule of the weight-streaming GEMMs (bf16, fp8, 4-bit): with few
// CTAs (few rows, few experts) the SMs would idle, so each CTA's K range is cut
// into slices, enough for `waves` rounds of the CTA slots the shared memory
// allows, never below `min_steps_per_split` pipeline steps a slice.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moekit::cuda {

struct StreamKSplitRule {
  int64_t ctas = 0;              // CTAs of the unsliced launch
  int64_t smem_per_cta = 0;      // dynamic shared memory of one CTA
  int64_t max_ctas_per_sm = 0;   // the instance's register (or hardware) limit
  int64_t k_steps = 0;           // pipeline steps along K of one CTA
  int64_t min_steps_per_split = 4;
  int64_t waves = 4;             // slots to fill, in rounds
  int64_t max_splits = 8;
};

inline int64_t stream_k_splits(const StreamKSplitRule& r, int sm_count) {
  constexpr int64_t kSmemPerSm = 227 * 1024, kReservedPerCta = 1024;
  const int64_t per_sm = std::clamp<int64_t>(kSmemPerSm / (r.smem_per_cta + kReservedPerCta), 1, r.max_ctas_per_sm);
  const int64_t slots = static_cast<int64_t>(sm_count) * per_sm;
  const int64_t want = (r.waves * slots + r.ctas - 1) / std::max<int64_t>(1, r.ctas);
  const int64_t by_k = r.k_steps / r.min_steps_per_split;
  return std::clamp<int64_t>(std::min(want, by_k), 1, r.max_splits);
}

}  // namespace moekit::cuda
