// The expert stages of the fp8 schemes, shared by Sm90Modular and
// Sm90Monolithic (so both give bitwise-equal outputs): align by expert ->
// quantize GEMM1's input -> fp8 grouped GEMM1 -> activation -> quantize GEMM2's
// input -> fp8 grouped GEMM2 -> weighted top-k reduction (fp8_experts.h). One
// stream, the caller's workspace, no allocation, no host synchronization.
//
// The GEMMs stream the weights (fp8_streaming_gemm.h, sm_89 on) while experts
// get few rows, else run a tensor-core grouped GEMM: CUTLASS's on Hopper
// (fp8_gemm_cutlass_sm90.h), the mma.sync one elsewhere (fp8_mma_gemm.h).
// kernel.sm90_fp8_gemm = mma_sync|cutlass|streaming (MoeConfig::kernel, or
// MOEKIT_SM90_FP8_GEMM) forces a path (for comparisons).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "experts/cuda/moe_pipeline.h"
#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

// Byte offsets in the workspace for M tokens, each 256-byte aligned.
// NOTE: topk_ids and topk_weights come first, at the offsets
// experts_workspace_layout gives them, so the monolithic router writes them in
// the same place whichever pipeline follows.
struct Fp8WorkspaceLayout : PairWorkspaceLayout {
  size_t amax = 0;           // [2] f32: dynamic per-tensor amax of GEMM1's and GEMM2's input
  // [M·k, n1] f32: GEMM1's output, or the streaming GEMM1's activation ([M·k, I] f32)
  size_t gemm1_out = 0;
  size_t expert_out = 0;     // [M·k, H] f32: GEMM2 per permuted row (or its K slices), in gemm1_out's bytes
  // The GEMM inputs; GEMM2's lie in the bytes of GEMM1's (GEMM1 has read those):
  size_t x_q8 = 0;           // [M·k, H] e4m3
  size_t x_scale = 0;        // [M·k · ceil(H/128)] f32, Fp8GemmLaunch::a_scale layout
  size_t act_q8 = 0;         // [M·k, I] e4m3
  size_t act_scale = 0;      // [M·k · ceil(I/128)] f32
  size_t gemm_tables = 0;    // the tensor-core GEMM's problem tables (fp8_*_gemm_workspace_size)
  size_t x_tokens = 0;       // [M, H] e4m3: GEMM1's input quantized once per token (dynamic scales)
  size_t x_token_scale = 0;  // [M, ceil(H/128)] f32, by row
  size_t total = 0;
};
Fp8WorkspaceLayout fp8_workspace_layout(const ExpertsShape& s, int64_t num_tokens);

// The prepared fp8 weights on the device (checkpoint layout, no re-layout).
struct Fp8ExpertWeights {
  QuantScheme quant;
  const uint8_t* w13 = nullptr;       // [E, n1, H] e4m3
  const uint8_t* w2 = nullptr;        // [E, H, I] e4m3
  const float* w13_scale = nullptr;   // MoeWeights layout (kernel.h)
  const float* w2_scale = nullptr;
  const float* a13_scale = nullptr;   // [E], static act scales only
  const float* a2_scale = nullptr;
  // The weight scales as the tensor-core GEMMs read them (fp8_expand_weight_scales).
  const float* w13_gemm_scale = nullptr;  // [parts (gate, up), E, ceil(H/128), ceil(I/128)], or one [E, ceil(H/128), N1/128]
  const float* w2_gemm_scale = nullptr;   // [E, ceil(I/128), ceil(H/128)]
};

// Whether the tensor-core GEMM1 runs once over all of W13's rows (gate and up
// parts of whole 128-row scale blocks, or no gate): w13_gemm_scale then holds
// fp8_expand_weight_scales(part = -1), else one expansion per part, in turn.
bool fp8_gemm1_single_launch(const ExpertsShape& s);
// Floats of Fp8ExpertWeights::w13_gemm_scale.
int64_t fp8_w13_gemm_scale_count(const ExpertsShape& s);

struct Fp8ExpertsRun {
  int64_t num_tokens = 0;               // M
  const uint16_t* hidden = nullptr;     // [M, H] bf16
  const int32_t* topk_ids = nullptr;    // [M, k] i32
  const float* topk_weights = nullptr;  // [M, k] f32
  uint16_t* out = nullptr;              // [M, H] bf16, every element written
  int32_t* expert_counts = nullptr;     // [E] i32, optional
  char* workspace = nullptr;            // >= fp8_workspace_layout(s, M).total bytes
  // Expert parallelism (MoeRunArgs::skip_negative_ids): a negative id
  // contributes nothing instead of making the token's row NaN.
  bool skip_negative_ids = false;
};

// The GEMM path a forward of M tokens takes: "streaming" (fp8_streaming_gemm.h,
// few rows per expert), "cutlass" (fp8_gemm_cutlass_sm90.h), or "mma_sync e4m3"
// / "mma_sync f16" (fp8_mma_gemm.h with those operands).
const char* fp8_gemm_path_name(const ExpertsShape& s, int64_t num_tokens);

Status run_experts_fp8(const ExpertsShape& s, const Fp8ExpertWeights& w, const Fp8ExpertsRun& run,
                       cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
