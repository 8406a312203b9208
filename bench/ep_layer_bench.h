// `moekit bench --ep N`, second part: the whole expert-parallel layer on N
// GPUs against the single-GPU layer, DeepSeek-V3 shape, bf16 or fp8 block-128
// weights (--scheme), balanced routing (i.i.d. logits, a negligible score bias).
//
// For each M (tokens per rank):
//   ep        one forward of ExpertParallelLayer on every rank (M tokens each),
//             captured in a CUDA graph; median over reps of the slowest rank
//   single    one forward of MoeLayer on cuda:0 over N·M tokens, same graph timing
//   speedup   single / ep: the group's throughput over one GPU's
//   phases    eager forwards with phase timing: dispatch, experts, combine
//             (median, slowest rank), and dispatch+combine over two raw
//             all_to_all_v moving the same bytes (rows of dispatch and combine)
// The EP layer of each M is created with max_num_tokens = M: its all-to-alls
// move max_num_tokens rows per peer whatever the routing (counts stay on the device).
#pragma once

#include <ostream>

#include "ep_comm_bench.h"
#include "moekit/status.h"

namespace moekit::bench {

Status run_ep_layer_bench(const EpCommBenchOptions& options, std::ostream& log);

}  // namespace moekit::bench
