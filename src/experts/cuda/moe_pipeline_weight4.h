// The expert stages of the 4-bit weight schemes (mxfp4, int4_g32, int4_g128;
// W4A16: bf16 activations, f32 accumulation), shared by Sm90Modular and
// Sm90Monolithic so both give bitwise-equal outputs. Two paths, by rows per
// expert (weight4_gemm_path):
//   streaming (decode): align by expert -> GEMM1 on the packed weights with bias
//     and activation in its epilogue (bf16 intermediate) -> GEMM2 on the packed
//     weights (f32, K slices where few rows would leave SMs idle) -> weighted
//     top-k reduction with the w2 bias (finalize.h). Both GEMMs stream the packed
//     bytes once and unpack them in registers (weight4_streaming_gemm.h).
//   mixed (prefill, int4_g128): align -> the scales as bf16 (weight4_dequant.h)
//     -> CUTLASS's mixed-input grouped GEMMs, which read the packed weights once
//     and convert them in registers (grouped_gemm_cutlass.h) -> finalize.
//   dequant (prefill, the other schemes): align -> for each chunk of experts, the
//     weights dequantized to bf16 (weight4_dequant.h) and the bf16 tensor-core
//     grouped GEMMs of the bf16 pipeline on that chunk's rows -> finalize.
// One stream, the caller's workspace, no allocation, no host synchronization.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "experts/cuda/moe_pipeline.h"
#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

// The GEMMs of a forward: the decode kernel, CUTLASS's mixed-input GEMM, or dequantize-then-GEMM.
enum class Weight4GemmPath { kStreaming, kMixed, kDequant };

// Byte offsets in the workspace for M tokens, each 256-byte aligned.
// NOTE: topk_ids and topk_weights come first, at the offsets
// experts_workspace_layout gives them (take_pair_workspace), so the monolithic
// router writes them in the same place whichever pipeline follows.
struct Weight4WorkspaceLayout : PairWorkspaceLayout {
  Weight4GemmPath path = Weight4GemmPath::kStreaming;  // weight4_gemm_path of the forward it lays out
  size_t intermediate = 0;  // [M·k, I] bf16: act(GEMM1 + bias) per permuted row
  size_t partials = 0;      // [k_splits, M·k, H] f32: GEMM2's K-slice partial sums (dequant: [M·k, H] bf16)
  // The dequant path only (size 0 otherwise):
  int64_t chunk_experts = 0;  // experts dequantized at a time
  size_t dequant = 0;         // [chunk_experts, max(N1·H, H·I)] bf16: one chunk's W13, then its W2
  // The mixed path only (size 0 otherwise):
  size_t bf16_scales = 0;     // [E, max(H/group·N1, I/group·H)] bf16: W13's scales, then W2's
  // Both:
  size_t gemm1_raw = 0;       // [M·k, N1] bf16: GEMM1 before bias and activation (expert_bias)
  size_t gemm1_scratch = 0;   // workspace of (one chunk's) GEMM1
  size_t gemm2_scratch = 0;
  size_t total = 0;
};
Weight4WorkspaceLayout weight4_workspace_layout(const ExpertsShape& s, QuantMethod method, int64_t num_tokens);

// The prepared 4-bit weights on the device (sm90_weights.h has the layouts).
struct Weight4ExpertWeights {
  QuantMethod method = QuantMethod::kMxfp4;
  const uint8_t* w13 = nullptr;      // [E, N1, H/2] packed, kGateUpBlock row order
  const uint8_t* w2 = nullptr;       // [E, H, I/2] packed
  const void* w13_scale = nullptr;   // [E, H/group, N1], u8 E8M0 (mxfp4) or f32 (int4), W13's row order, weight4_scale_position
  const void* w2_scale = nullptr;    // [E, I/group, H]
  int mxfp4_max_code = 255;          // the largest E8M0 code of both (mxfp4)
  const float* w13_bias = nullptr;   // [E, N1] f32 in W13's row order, iff s.expert_bias
  const float* w2_bias = nullptr;    // [E, H] f32, iff s.expert_bias
};

// Mean rows per non-empty expert from which the mixed-input GEMM replaces
// streaming. Measured on the H200 with each path forced (scripts/weight4_round.sh,
// int4_g128, bench/results/h200_v12): at 32 rows mixed is faster on DeepSeek-V3
// (5.48 against 5.66 ms) and Mixtral-8x7B (0.81 against 0.90 ms); at 16 rows
// streaming is (Qwen3-30B-A3B: 0.30 against 0.39 ms).
inline constexpr int64_t kWeight4MixedMinRows = 32;
// ... and from which its 256-token tile replaces the 128-token one (measured with
// each tile forced: at 128 rows 0.92x the time on Mixtral-8x7B, 0.96x on DeepSeek-V3;
// at 64 rows 1.30x on Qwen3-30B-A3B).
inline constexpr int64_t kWeight4MixedWideRows = 128;
// Mean rows per non-empty expert above which dequant replaces streaming (the
// schemes the mixed-input GEMM does not take). Measured with each path forced
// (bench/results/h200_v11): streaming is faster up to 128 rows on all four
// benchmark shapes (DeepSeek-V3 at 128 rows: 18.6 ms against 27.0 ms), dequant
// from 256 (Mixtral at 256 rows: 3.7 ms against 4.6 ms; Qwen3-30B-A3B: 1.79 ms
// against 2.31 ms).
inline constexpr int64_t kWeight4DequantMinRows = 128;
// Whether this build and `method` have the mixed-input GEMM (int4_g128 with the
// CUTLASS kernels built), and why not.
Support weight4_mixed_gemm_supports(const ExpertsShape& s, QuantMethod method);
// The path of a forward of M tokens: kernel.sm90_w4_gemm (streaming | mixed |
// dequant) when set; else streaming when batch-invariant (one path for every M);
// else mixed where supported from kWeight4MixedMinRows rows per expert, dequant
// above kWeight4DequantMinRows, streaming below.
Weight4GemmPath weight4_gemm_path(const ExpertsShape& s, QuantMethod method, int64_t num_tokens);

// The GEMM path and instance of a forward of M tokens, one line (for gemm_plan).
std::string weight4_gemm_plan(const ExpertsShape& s, QuantMethod method, int64_t num_tokens);

Status run_experts_weight4(const ExpertsShape& s, const Weight4ExpertWeights& w, const ExpertsRun& run,
                           cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
