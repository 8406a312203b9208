// The replica rule of EPLB (moekit/eplb.h, replica_for_token) as flat arrays a
// device kernel can read: logical expert e's physical slots are
// slots[offsets[e] .. offsets[e + 1]), in placement order.
//
// NOTE: replica_slot() is the one place the device path applies the rule; it
// must pick exactly what replica_for_token picks, so a token's replica is the
// same on the host and GPU paths (ep_replica_table_test checks it).
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/status.h"

#if defined(__CUDACC__)
#define MOEKIT_HOST_DEVICE __host__ __device__
#else
#define MOEKIT_HOST_DEVICE
#endif

namespace moekit::dispatch {

struct ReplicaTable {
  std::vector<int32_t> offsets;  // [E + 1] i32: first entry of each logical expert in `slots`
  std::vector<int32_t> slots;    // [total replicas] i32: physical slot ids
};

// From ExpertPlacement::replicas() ([E] lists of physical slots). Every expert
// needs at least one replica (an error names the first that has none).
StatusOr<ReplicaTable> make_replica_table(const std::vector<std::vector<int32_t>>& replicas);

// The physical slot that (logical expert, token_key) goes to, or -1 for an id
// outside [0, num_logical).
MOEKIT_HOST_DEVICE inline int32_t replica_slot(const int32_t* offsets, const int32_t* slots, int32_t num_logical,
                                               int32_t logical, int64_t token_key) {
  if (logical < 0 || logical >= num_logical) return -1;
  const int32_t first = offsets[logical];
  const int64_t count = offsets[logical + 1] - first;
  return slots[first + token_key % count];
}

}  // namespace moekit::dispatch
