// `moekit bench --ep N`: what moving one DeepSeek-V3 layer's tokens between N
// GPUs costs with the NCCL communicator, per token count M (tokens per rank):
//   raw       all_to_all_v of exactly M*k bf16 rows per rank, spread evenly
//             (the bytes of a plain NCCL all-to-all of the routed rows)
//   dispatch  all_to_all_v as the GPU EP prepare sizes it: M rows per peer
//             (each token at most once per rank), k i32 + k f32 (padded to
//             16 bytes) + bf16 H per row
//   combine   all_to_all_v as the GPU EP finalize sizes it: M bf16 rows of H
//             per peer (one partial sum per received token)
// With counts only on the device, the communicator moves whole worst-case
// blocks, so dispatch/combine here are the cost of that design, not of the
// rows a balanced batch needs. One thread per GPU, each its own rank.
// Then (time_layer) the whole EP layer against one GPU: ep_layer_bench.h.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "moekit/comm.h"
#include "moekit/status.h"

namespace moekit::bench {

struct EpCommBenchOptions {
  int ranks = 2;
  std::vector<int64_t> m_list = {1, 128, 256, 4096, 16384};
  int64_t hidden = 7168;    // DeepSeek-V3
  int64_t experts = 256;
  int top_k = 8;
  int reps = 20;            // timed repetitions per case (median reported)
  // The whole-layer timing (ep_layer_bench.h) uses these too:
  int64_t intermediate = 2048;
  bool time_layer = true;   // after the collectives, time the EP layer against one GPU
  std::string scheme = "bf16";  // the layer's weights: bf16 or fp8-block (block-128 scales)
};

Status run_ep_comm_bench(const EpCommBenchOptions& options, std::ostream& log);

// Median microseconds of `reps` all_to_all_v calls on `stream` (a cudaStream_t)
// with every count at max_rows: what moving [N, max_rows, row_bytes] costs.
// Collective.
StatusOr<double> time_all_to_all_us(Communicator& comm, void* stream, int64_t max_rows, size_t row_bytes, int reps);

}  // namespace moekit::bench
