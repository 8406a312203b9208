// The expert tensors one rank holds (one entry per local physical slot, as
// the checkpoint stores them: weights, biases, quantization scales), and
// moving them between ranks when the placement changes.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/eplb.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::eplb {

// One per-expert tensor of MoeWeights ([E, ...] there): one slot's piece of it
// has `slot_shape` in `dtype`; a part the layer does not have is absent.
struct SlotPart {
  const char* name = "";
  TensorView MoeWeights::*field = nullptr;
  bool present = false;
  DType dtype = DType::kF32;
  std::vector<int64_t> slot_shape;  // [] for one value per expert (per-tensor scales)
  std::vector<char> data;           // [slots, slot_shape...]

  size_t slot_bytes() const;  // 0 when absent
};

// The parts in MoeWeights' order: w13, w2, w13_bias, w2_bias, w13_scale,
// w2_scale, a13_scale, a2_scale.
inline constexpr int kSlotParts = 8;

struct SlotWeights {
  int64_t slots = 0;
  std::array<SlotPart, kSlotParts> parts;

  SlotPart& part(TensorView MoeWeights::*field);
  const SlotPart& part(TensorView MoeWeights::*field) const;
  // The slots as a kernel prepares them: a view of every present part.
  MoeWeights kernel_weights() const;
};

// Rank `rank`'s slots under `placement` for a layer of `config`, copied from
// the full logical weights (every present part [E, ...], host; checked, errors
// name the tensor). Empty slots get zero weights and unit scales.
StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& placement, int rank,
                                                const MoeConfig& config);

// The same from weights that hold only those slots ([slots_per_rank, ...]).
StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& placement, int rank,
                                              const MoeConfig& config);

// Collective: this rank's slots under `next`. Each expert's tensors come from
// the lowest rank holding it under `current` (a local copy when that is this
// rank), through one all_to_all_v of whole experts: of host memory on host
// ranks, of device memory on GPU ranks (staged there from the host copies and
// back; the communicator moves them device to device).
StatusOr<SlotWeights> move_slot_weights(Communicator& comm, const SlotWeights& mine, const ExpertPlacement& current,
                                        const ExpertPlacement& next);

}  // namespace moekit::eplb
