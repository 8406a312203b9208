// The GPU MoE layer benchmark: the two hardware ceilings, then every
// (shape, M) case of a shape list timed as a whole layer (routing included)
// under a CUDA graph, against its floor. Writes JSON and prints a table last.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "moekit/status.h"

namespace moekit::bench {

struct GpuBenchOptions {
  std::string shapes_path = "bench/shapes/moe_layers.json";  // shape list (see that file)
  std::vector<int64_t> m_list;    // empty: the list in the shape file
  std::vector<std::string> only;  // shape names to run; empty: all
  std::string backend = "cuda_sm90";  // MoeConfig::backend ("auto" lets the oracle choose)
  std::string json_path;          // where results go; empty: not written
  std::string dump_dir;           // where outputs of dump cases go (.npy); empty: none
  std::vector<int64_t> dump_m = {1, 64};  // M values whose set-0 output is dumped for the peer check
  int num_sets = 4;               // rotating input sets (different experts touched each time)
  double seconds_per_case = 0.25; // timed seconds per case, split over the sets
  int min_reps = 3;               // timed launches per set, at least
  double read_gib = 4.0;          // HBM read ceiling: bytes read per repeat
  int matmul_n = 8192;            // matmul ceiling: n x n x n bf16
  int ceiling_repeats = 10;
  uint32_t seed = 20261129u;
  std::vector<std::string> variants;  // "NAME:VAR=VALUE,..." timed beside the default, interleaved
  double skew = 0.0;              // 0: balanced routing; > 0: Zipf-like expert popularity (gpu_moe_bench.cu)
  // Extras on every shape, to measure what they cost (also settable per shape in the list):
  bool expert_bias = false;         // gate/up and down biases (gpt-oss style)
  int64_t shared_intermediate = 0;  // > 0: a shared expert of this width
  bool shared_gate = false;         // the shared expert's sigmoid gate (needs shared_intermediate)
  // MoeConfig::shared_expert_overlap on shapes with a shared expert: "off", "on", or "both"
  // (off is the default and a variant "overlap" with it on is timed interleaved, same process).
  std::string shared_overlap = "off";
  // Also time every case with capture on and with replay, interleaved with the default (variants
  // "capture" and "replay"; their ratio to the default is the overhead).
  bool capture_modes = true;
  bool batch_invariant = false;  // every layer with MoeConfig::batch_invariant (docs/batch_invariance.md)
  std::string scheme = "bf16";      // bf16 | fp8-block | fp8-tensor (docs/fp8.md); fp8 floors use the fp8 matmul rate
};

// Runs the benchmark on the current CUDA device; progress goes to `log`, the
// table last. Fails (nothing written) when no CUDA device or no backend serves.
Status run_gpu_moe_bench(const GpuBenchOptions& options, std::ostream& log);

}  // namespace moekit::bench
