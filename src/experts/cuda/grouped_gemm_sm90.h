// The Hopper paths behind grouped_gemm.h, and the table that picks one per
// problem. grouped_gemm() asks choose_sm90_gemm() first and runs the reference
// kernel only when the answer is kReference.
//
//   kStreaming  decode-size groups: each expert's weights streamed once over many
//               CTAs (streaming_gemm.cuh), gather and activation fused
//   kCutlass    prefill-size groups: CUTLASS sm90 warp-specialized grouped GEMM, or
//               for cuda_sm80 the CUTLASS 2.x one (grouped_gemm_cutlass.h), built
//               when the CUTLASS headers are found
//   kReference  the reference tiled kernel (grouped_gemm.cu)
//
// The kernel options (MoeConfig::kernel, or their environment variables):
// sm90_gemm = reference|streaming|cutlass forces a path where it can serve the
// problem, sm90_stream = <variant name> (streaming_gemm.h) a streaming instance,
// sm90_cutlass = <tile name> (grouped_gemm_cutlass.h) a CUTLASS tile (an sm80_
// tile on Hopper too; an sm90 tile forced on cuda_sm80 is ignored)
// (benchmarks and tests compare them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/grouped_gemm_cutlass.h"
#include "experts/cuda/streaming_gemm.h"
#include "moekit/status.h"

namespace moekit::cuda {

enum class Sm90GemmPath : uint8_t { kReference, kStreaming, kCutlass };
const char* sm90_gemm_path_name(Sm90GemmPath p);

// What the table chose for one problem. Plain and printable.
struct Sm90GemmChoice {
  Sm90GemmPath path = Sm90GemmPath::kReference;
  sm90::StreamVariant variant = sm90::StreamVariant::kRows128K64;  // kStreaming: the instance
  std::string reason;    // why this path (the table's rule, or why a faster path could not serve)
  CutlassTile cutlass_tile = CutlassTile::kM128N256;  // kCutlass: the instance
  // kStreaming: groups with more rows than this go to the CUTLASS tile above in a
  // second launch (0: none). The table's estimate of rows per group is a mean; with
  // a skewed load a few hot experts hold many times that, and the streaming kernel
  // would stream their weights once per token tile.
  int64_t cutlass_above_rows = 0;
  std::string to_string() const;
};

// The tile table. Rows per expert are estimated from max_rows / min(G, max_rows)
// (max_rows bounds the routed rows M·k); the estimate only picks a speed, every
// path is correct for any distribution of rows over groups.
Sm90GemmChoice choose_sm90_gemm(const GroupedGemmProblem& problem);

// ok, or why the CUTLASS path cannot serve the problem (also: not in this build).
Support sm90_cutlass_supports(const GroupedGemmProblem& problem);

// K slices the chosen path wants (grouped_gemm_k_splits): > 1 only for the
// streaming path on problems with too few slabs to fill the GPU.
int64_t sm90_gemm_k_splits(const GroupedGemmProblem& problem);

// Scratch the chosen path needs (0 for kStreaming and kReference).
size_t sm90_gemm_workspace_size(const GroupedGemmProblem& problem);

// Runs a choice whose path is not kReference.
Status run_sm90_gemm(const Sm90GemmChoice& choice, const GroupedGemmProblem& problem, const GroupedGemmArgs& args,
                     cudaStream_t stream);

}  // namespace moekit::cuda
