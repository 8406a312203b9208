// Internals of the CPU router, for CPU kernels that route inside (the
// monolithic kernel) and have validated their arguments already.
#pragma once

#include <cstdint>

#include "moekit/routing.h"

namespace moekit::cpu {

// Routes rows [begin, end) of `args` by docs/routing.md: writes topk_ids,
// topk_weights and (when given) routing_replay_out for those rows, nothing else.
// Preconditions: validate_routing_args(cfg, args, Device::cpu()) returned ok.
// Single-threaded; the result of a row never depends on the other rows.
void route_rows(const RoutingConfig& cfg, const RoutingArgs& args, int64_t begin, int64_t end);

// Overwrites expert_counts [E] i32 with the number of rows of topk_ids [M, k]
// that use each expert. Preconditions as route_rows, topk_ids written.
void count_experts(const RoutingArgs& args);

}  // namespace moekit::cpu
