// Re-layout of W13 for the grouped GEMM's gated epilogue (NOTE in
// grouped_gemm.h): each block of kGateUpBlock intermediate columns gets its
// gate rows followed by its up rows, whatever the checkpoint's order was
// (gate rows first for silu/gelu, interleaved 2i/2i+1 for swiglu_oai).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "experts/cuda/grouped_gemm.h"
#include "moekit/config.h"
#include "moekit/status.h"

#ifdef __CUDACC__
#define MOEKIT_HOST_DEVICE __host__ __device__
#else
#define MOEKIT_HOST_DEVICE
#endif

namespace moekit::cuda {

// Rows of one expert's prepared W13, [N1, H], N1 = 2I (gated) or I (relu2):
// the checkpoint row that prepared row `row` comes from.
MOEKIT_HOST_DEVICE inline int64_t w13_source_row(Activation kind, int64_t intermediate, int64_t row) {
  const int64_t block = row / (2 * kGateUpBlock);
  const int64_t within = row % (2 * kGateUpBlock);
  const int64_t col = block * kGateUpBlock + within % kGateUpBlock;  // intermediate column
  const bool up = within >= kGateUpBlock;
  switch (gate_up_layout(kind)) {
    case GateUpLayout::kSplit: return up ? intermediate + col : col;        // [gate rows; up rows]
    case GateUpLayout::kInterleaved: return up ? 2 * col + 1 : 2 * col;    // gpt-oss: gate 2i, up 2i+1
    case GateUpLayout::kNotGated: return row;                               // as stored
  }
  return row;
}

// dst[e, r, :] = src[e, w13_source_row(kind, I, r), :] for a device src/dst [E, N1, H] bf16.
Status relayout_w13(const uint16_t* src, uint16_t* dst, int64_t num_experts, int64_t n1, int64_t hidden,
                    Activation kind, int64_t intermediate, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
