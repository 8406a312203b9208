// What both expert-parallel PrepareFinalize implementations share: checks of
// shapes and physical ids, the dispatch row format, and turning a received row
// into pairs.
#pragma once

#include <cstdint>

#include "dispatch/ep_host_exchange.h"

namespace moekit::dispatch {

// Sizes are positive and every buffer index fits in i32.
Status check_ep_shape(const Communicator& comm, const EpShape& shape);

// ids [M, k]: every physical slot in [0, num_slots) and holding an expert.
Status check_physical_ids(const int32_t* ids, int64_t num_tokens, int64_t top_k, const ExpertPlacement& placement);

// A dispatch row: [k] i32 (the slot wanted on the receiving rank, or -1), then
// the token's H activations in the act dtype (bf16 travels as bf16: exact).
size_t dispatch_row_bytes(const EpShape& shape);

// Appends one pair per wanted slot of `row` at index `next`: x_pairs[p] = the
// activations widened to f32, pair_slot[p] = the slot. Returns the next index.
int64_t unpack_dispatch_row(const char* row, const EpShape& shape, int64_t next, float* x_pairs, int32_t* pair_slot);

}  // namespace moekit::dispatch
