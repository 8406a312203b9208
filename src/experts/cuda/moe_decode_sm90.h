// Host entry of the weight-streaming grouped GEMM (moe_decode_sm90.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "experts/cuda/grouped_gemm.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cuda::sm90 {

inline constexpr int kStreamBlockK = 64;  // NOTE: K must be a multiple (StreamTraits::kBlockK)

// ok, or why the streaming kernel cannot serve the problem with slabs of `slab_rows`.
Support streaming_gemm_supports(const GroupedGemmProblem& problem, int slab_rows);

// slab_rows: 64 | 128; token_tile: 64 (slab 64) | 128 (slab 128).
Status streaming_gemm(const GroupedGemmProblem& problem, const GroupedGemmArgs& args, int slab_rows, int token_tile,
                      cudaStream_t stream);

}  // namespace moekit::cuda::sm90
