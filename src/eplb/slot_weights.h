// The expert weights one rank holds (one entry per local physical slot, in
// the checkpoint's dtype), and moving them between ranks when the placement
// changes.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/comm.h"
#include "moekit/eplb.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::eplb {

struct SlotWeights {
  DType dtype = DType::kBF16;
  int64_t slots = 0, n1 = 0, hidden = 0, intermediate = 0;
  std::vector<char> w13;  // [slots, n1, H]; empty slots are zeros
  std::vector<char> w2;   // [slots, H, I]

  size_t w13_bytes() const { return n1 * hidden * dtype_size(dtype); }           // one slot
  size_t w2_bytes() const { return hidden * intermediate * dtype_size(dtype); }  // one slot
  TensorView w13_view() const;  // [slots, n1, H]
  TensorView w2_view() const;   // [slots, H, I]
};

// Rank `rank`'s slots under `placement`, copied from the full logical weights
// (w13 [E, n1, H], w2 [E, H, I], host, dtype; checked).
StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& placement, int rank,
                                                DType dtype, int64_t n1, int64_t hidden, int64_t intermediate);

// Rank `rank`'s slots under `placement` from weights that hold only those
// slots (w13 [slots_per_rank, n1, H], w2 [slots_per_rank, H, I]; checked);
// empty slots become zeros.
StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& placement, int rank,
                                              DType dtype, int64_t n1, int64_t hidden, int64_t intermediate);

// Collective: this rank's slots under `next`. Each expert's weights come from
// the lowest rank holding it under `current` (a local copy when that is this
// rank), through one all_to_all_v of whole experts.
StatusOr<SlotWeights> move_slot_weights(Communicator& comm, const SlotWeights& mine, const ExpertPlacement& current,
                                        const ExpertPlacement& next);

}  // namespace moekit::eplb
