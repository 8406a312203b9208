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
  DType bias_dtype = DType::kF32;  // of the biases, when the layer has them (f32 or dtype)
  int64_t slots = 0, n1 = 0, hidden = 0, intermediate = 0;
  bool has_bias = false;
  std::vector<char> w13;       // [slots, n1, H]; empty slots are zeros
  std::vector<char> w2;        // [slots, H, I]
  std::vector<char> w13_bias;  // [slots, n1] iff has_bias
  std::vector<char> w2_bias;   // [slots, H] iff has_bias

  size_t w13_bytes() const { return n1 * hidden * dtype_size(dtype); }           // one slot
  size_t w2_bytes() const { return hidden * intermediate * dtype_size(dtype); }  // one slot
  size_t w13_bias_bytes() const { return has_bias ? n1 * dtype_size(bias_dtype) : 0; }
  size_t w2_bias_bytes() const { return has_bias ? hidden * dtype_size(bias_dtype) : 0; }
  TensorView w13_view() const;  // [slots, n1, H]
  TensorView w2_view() const;   // [slots, H, I]
  // The slots as a kernel prepares them: the views above, with the biases when the layer has them.
  MoeWeights kernel_weights() const;
};

// Rank `rank`'s slots under `placement`, copied from the full logical weights
// (w13 [E, n1, H], w2 [E, H, I], host, dtype; with w13_bias [E, n1] and w2_bias
// [E, H] when given, f32 or dtype; checked).
StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& placement, int rank,
                                                DType dtype, int64_t n1, int64_t hidden, int64_t intermediate);

// Rank `rank`'s slots under `placement` from weights that hold only those
// slots (w13 [slots_per_rank, n1, H], w2 [slots_per_rank, H, I], biases
// [slots_per_rank, ...] when given; checked); empty slots become zeros.
StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& placement, int rank,
                                              DType dtype, int64_t n1, int64_t hidden, int64_t intermediate);

// Collective: this rank's slots under `next`. Each expert's weights come from
// the lowest rank holding it under `current` (a local copy when that is this
// rank), through one all_to_all_v of whole experts.
StatusOr<SlotWeights> move_slot_weights(Communicator& comm, const SlotWeights& mine, const ExpertPlacement& current,
                                        const ExpertPlacement& next);

}  // namespace moekit::eplb
