// The argument checks every MoE layer makes before it writes anything
// (MoeLayer and ExpertParallelLayer alike): one rule, one message.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

// An ids target: [>= min_rows, k] i16 on `device`; `rows_for` names what sets
// min_rows in the message ("M", "max_num_tokens").
Status check_ids_rows(const TensorView& target, const char* name, int64_t min_rows, const char* rows_for, int k,
                      Device device);

// hidden [M, H] (1 <= M <= max_num_tokens) and out [M, H] in the act dtype,
// expert_counts [E] i32, routing_replay_out [>= M, k] i16, then either the
// caller's ids and weights (custom routing; ids in range on host devices) or
// the router logits [M, E] with optional forced ids [M, k] i32 on the host
// (range, duplicates, sentinel). All on `device` unless said.
Status check_forward_args(const MoeConfig& config, const LayerForwardArgs& args, Device device);

}  // namespace moekit
