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

// What RoutedLayer::set_capture_target needs: ids [>= max_num_tokens, k] i16
// and router weights [same rows, k] f32 (only with ids) on the layer's device,
// each refused with the layer's reason when it cannot write them.
Status check_capture_targets(const RoutedLayer& layer, const TensorView& ids, const TensorView& router_weights);

// hidden [M, H] (1 <= M <= max_num_tokens) and out [M, H] in the act dtype,
// expert_counts [E] i32, routing_replay_out [>= M, k] i16 (when the layer can
// write ids), then either the caller's ids and weights (custom routing; ids in
// range on host devices) or the router logits [M, E] with optional forced ids
// [M, k] i32 on the host (range, duplicates, sentinel). All on the layer's
// device unless said.
Status check_forward_args(const RoutedLayer& layer, const LayerForwardArgs& args);

}  // namespace moekit
