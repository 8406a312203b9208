// Routing: router logits -> top-k expert ids and weights, by the versioned spec
// of docs/routing.md. The same rules hold on every backend.
#pragma once

#include "moekit/config.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

struct RoutingArgs {
  // Inputs
  TensorView logits;      // [M, E] f32|bf16, required (replay computes weights from the live logits)
  TensorView score_bias;  // [E] f32, optional; deepseek_v3 only, used for selection, never in weights
  TensorView forced_ids;  // [M, k] i32, optional: replay; selection is skipped, weights computed for these ids
  // Outputs (rows [0, M) fully written)
  TensorView topk_ids;       // [M, k] i32, logical ids in spec order
  TensorView topk_weights;   // [M, k] f32
  TensorView expert_counts;  // [E] i32, optional; overwritten with tokens routed to each expert
  TensorView routing_replay_out;  // [>=M, k] i16, optional capture target; only rows [0, M) written
};

// Host-side checks shared by every backend: shapes, dtypes, devices, forced id
// range/duplicates (only when the ids are host-readable), bias presence.
Status validate_routing_args(const RoutingConfig& cfg, const RoutingArgs& args, Device device);

// Rejects non-finite logits (the spec's NaN/Inf rule) naming the first bad (row, expert).
Status check_logits_finite(const TensorView& logits);

// Rejects forced ids that are out of [0, E), duplicated within a row, or the -1
// capture sentinel, naming the first bad (row, slot). ids: host [M, k] i32|i16.
Status check_forced_ids(const TensorView& ids, int64_t num_experts);

// Routes on the device the tensors live on (the logits' device): host tensors
// on the CPU, CUDA tensors on their device, enqueued on `stream` (no
// allocation, no host synchronization). The same spec and the same checks on
// every device; everything is validated before anything is written.
Status route(const RoutingConfig& cfg, const RoutingArgs& args, Stream stream = nullptr);

// CPU routing (what route() runs for host tensors).
Status route_cpu(const RoutingConfig& cfg, const RoutingArgs& args);

// Custom routing's routing step, on the ids' device (enqueued on `stream`):
// topk_ids [M, k] i32 (M may be 0) are the caller's; expert_counts ([E] i32,
// optional) is overwritten with their tokens per expert (an id outside [0, E)
// counts nowhere: on a GPU only the device sees it, and its row is NaN) and
// routing_replay_out ([>= M, k] i16, optional) gets them as given.
Status record_caller_ids(const TensorView& topk_ids, int64_t num_experts, const TensorView& expert_counts,
                         const TensorView& routing_replay_out, Stream stream = nullptr);

// load[e] += counts[e] for counts [E] i32 and load [E] int64 on counts' device
// (the expert-load counters an EPLB plan reads).
Status accumulate_expert_load(const TensorView& counts, int64_t* load, Stream stream = nullptr);

}  // namespace moekit
