// `moekit bench --ep N`: what moving one DeepSeek-V3 layer's tokens between N
// GPUs costs with the NCCL communicator, per token count M (tokens per rank):
//   raw       all_to_all_v of exactly M*k bf16 rows per rank, spread evenly
//             (the bytes of a plain NCCL all-to-all of the routed rows)
//   dispatch  all_to_all_v as the EP prepare sizes it: M rows per peer
//             (each token at most once per rank), bf16 H + k i32 per row
//   combine   all_to_all_v as the EP finalize sizes it: M*min(k, E/N) fp32
//             pair rows per peer
// With counts only on the device, the communicator moves whole worst-case
// blocks, so dispatch/combine here are the cost of that design, not of the
// rows a balanced batch needs. One thread per GPU, each its own rank.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "moekit/status.h"

namespace moekit::bench {

struct EpCommBenchOptions {
  int ranks = 2;
  std::vector<int64_t> m_list = {1, 128, 4096, 16384};
  int64_t hidden = 7168;    // DeepSeek-V3
  int64_t experts = 256;
  int top_k = 8;
  int reps = 20;            // timed repetitions per case (median reported)
};

Status run_ep_comm_bench(const EpCommBenchOptions& options, std::ostream& log);

}  // namespace moekit::bench
