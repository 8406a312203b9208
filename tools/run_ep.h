// `moekit run --ep N`: the main job across N expert-parallel ranks, one
// thread each: over NCCL on N GPUs when this machine has them (sm_90, a build
// with NCCL, --backend not cpu), else over the loopback communicator on the
// CPU. Each step's rows are split evenly over the ranks, as data-parallel
// engine ranks hold them. The job runs three times: with the contiguous
// placement (capturing), after EPLB rebalanced every layer from the measured
// load (capturing again), and replaying the second capture; it reports the
// per-rank load before and after EPLB and whether outputs and ids matched.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/status.h"
#include "synthetic_model.h"

namespace moekit::tools {

struct EpRunOptions {
  SyntheticModelSpec spec;
  int ranks = 2;
  int64_t redundant_slots = -1;  // EPLB replicas beyond E over all ranks; -1: one per rank
  int num_requests = 8;
  int64_t prompt_tokens = 1024;
  int64_t decode_tokens = 16;
  std::string backend = "auto";  // "cpu" keeps the ranks on the host (loopback); another name needs GPU ranks
  std::string capture_path;      // the capture file to write (as `moekit run` writes it); empty: none
};

Status run_expert_parallel(const EpRunOptions& options);

}  // namespace moekit::tools
