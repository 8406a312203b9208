// Expert placement and EPLB (docs/design.md §2.5): which rank holds which
// *physical* expert slot, which *logical* expert each slot holds, and a planner
// that replicates hot experts and packs the slots onto ranks (DeepSeek's
// published expert-parallel load balancer, written from its description).
//
// Routing, capture and replay speak logical ids only. The replica a (token,
// slot) pair uses is a function of the token's position alone
// (replica_for_token), never of timing, so a replay through EPLB repeats the
// same placement decisions and the same bits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/status.h"

namespace moekit {

struct ExpertPlacement {
  int64_t num_logical = 0;   // E
  int num_ranks = 1;         // N
  int64_t slots_per_rank = 0;
  // [num_ranks * slots_per_rank]: the logical expert in each physical slot, or
  // -1 for an empty slot. Slot p lives on rank p / slots_per_rank.
  std::vector<int32_t> physical_to_logical;

  // Expert e on rank e / ceil(E / N), in order; the last rank's tail slots are
  // empty when N does not divide E.
  static StatusOr<ExpertPlacement> contiguous(int64_t num_logical, int num_ranks);

  // Every logical expert held by >= 1 slot, every entry in [-1, E), sizes consistent.
  Status validate() const;
  int64_t num_slots() const { return static_cast<int64_t>(physical_to_logical.size()); }
  int rank_of_slot(int64_t slot) const { return static_cast<int>(slot / slots_per_rank); }
  // logical -> its physical slots, ascending (valid placements only).
  std::vector<std::vector<int32_t>> replicas() const;
  std::string to_string() const;  // "rank 0: [0 1 5] rank 1: [2 3 5]"
};

// The physical slot serving logical expert `e` for the token at `token_key`
// (its position in the group's batch: ep_rank * max_num_tokens + row):
// replicas[e][token_key % replicas[e].size()]. A pure function of its inputs.
int32_t replica_for_token(const std::vector<std::vector<int32_t>>& replicas, int32_t logical, int64_t token_key);

struct EplbOptions {
  int64_t num_physical_slots = 0;  // total over all ranks; a multiple of num_ranks, >= num_logical
  int num_nodes = 1;               // ranks are split into this many equal nodes
  int num_groups = 1;              // expert groups (deepseek_v3 n_group); hierarchical when num_nodes divides it
};

// DeepSeek's EPLB for one layer, from per-logical-expert load `load` [E]:
// with num_nodes dividing num_groups, pack expert groups onto nodes balanced by
// load, replicate within each node the expert with the highest load per
// replica until the node's slots are full, then pack the node's replicas onto
// its ranks balanced (each rank gets exactly slots_per_rank). Otherwise the
// same with one node and one group (global policy). Deterministic: ties go to
// the lower index.
StatusOr<ExpertPlacement> plan_eplb(const std::vector<int64_t>& load, int num_ranks, const EplbOptions& options);

// Load each rank would serve under `placement` if every replica of an expert
// took an equal share of its load: [num_ranks].
std::vector<double> expected_rank_load(const ExpertPlacement& placement, const std::vector<int64_t>& load);

}  // namespace moekit
