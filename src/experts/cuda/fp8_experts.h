// The fp8 W8A8 expert stages on the device (docs/fp8.md) around the GEMMs.
// Activations are rounded through e4m3 exactly as the cpu backend rounds them
// (fp8_emulation.h: same f32 scale, same f32 quotient, same e4m3 value). The
// quantizer writes e4m3 bytes and the scales every GEMM path reads
// (moe_pipeline_fp8.h: fp8_streaming_gemm.h, fp8_gemm_cutlass_sm90.h, fp8_mma_gemm.h).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

// How one GEMM input is quantized.
struct Fp8ActQuant {
  QuantMethod method = QuantMethod::kFp8Block128;
  ActScale act_scale = ActScale::kDynamic;  // kFp8PerTensor only
  const float* static_scale = nullptr;      // [E] f32 device: static per-expert scales
  float* amax = nullptr;                    // [1] f32 device scratch: dynamic per-tensor amax
};

// Rows of a GEMM input: row r of the output is source row `row_index[r]` (or
// r when null) of `src`, rounded through e4m3 with the scheme's scales. With
// groups (group_start/group_rows) only the rows inside one are written; without,
// every row (then no static per-expert scale). src: [*, cols] bf16 bits
// (src_bf16) or f32, row stride ld. The output: the e4m3 bytes dst_q [rows,
// cols] and dst_scale in the layout of Fp8GemmLaunch::a_scale (needs the
// groups), or with scales_by_row [rows, ceil(cols/128)] (per-tensor: its one
// scale repeated per 128 columns).
struct Fp8QuantizeArgs {
  const void* src = nullptr;
  bool src_bf16 = true;
  int64_t ld = 0;
  const int32_t* row_index = nullptr;
  int64_t rows = 0, cols = 0;
  uint8_t* dst_q = nullptr;
  float* dst_scale = nullptr;
  bool scales_by_row = false;
  const int32_t* group_start = nullptr;  // [E] or null
  const int32_t* group_rows = nullptr;   // [E] or null
  int64_t num_experts = 0;
  // Set: src is GEMM1's f32 output [*, n1] (ld = n1) and column c's value is
  // the activation of its gate/up pair (the cpu backend's activations.h), so
  // the activation is never stored in f32.
  bool activation = false;
  ActivationConfig act;
};
Status fp8_quantize_rows(const Fp8QuantizeArgs& args, const Fp8ActQuant& quant, cudaStream_t stream);

// The e4m3 rows of quantized tokens [tokens, cols] with their scales by row
// ([tokens, ceil(cols/128)]) copied to the permuted rows of the tensor-core
// GEMM (row r = token row_index[r]), its scales in Fp8GemmLaunch::a_scale's
// layout; rows outside every group are left alone. cols a multiple of 16.
struct Fp8GatherArgs {
  const uint8_t* src_q = nullptr;
  const float* src_scale = nullptr;
  const int32_t* row_index = nullptr;  // [rows]
  int64_t rows = 0, cols = 0;
  uint8_t* dst_q = nullptr;
  float* dst_scale = nullptr;
  const int32_t* group_start = nullptr;  // [E]
  const int32_t* group_rows = nullptr;   // [E]
  int64_t num_experts = 0;
};
Status fp8_gather_rows(const Fp8GatherArgs& args, cudaStream_t stream);

// The weight scales of MoeWeights (kernel.h) of one row part of W [E, N, K]
// (`parts` parts of N/parts rows: gate, up) as Fp8GemmLaunch::b_scale reads
// them: out [E, ceil(K/128), ceil(N/parts/128)]; part = -1: all parts as one
// matrix, out [E, ceil(K/128), ceil(N/128)] (N/parts a multiple of 128 when parts > 1).
Status fp8_expand_weight_scales(QuantMethod method, const float* w_scale, int64_t num_experts, int64_t n, int64_t k,
                                int64_t parts, int64_t part, float* out, cudaStream_t stream);

// out[t, :] = bf16(sum_j w[t, j] * y[pair_row[t, j], :]), j ascending, fp32
// (a pair without a row makes the token's row NaN, unless skip_negative_ids
// and its id is negative: computed on another rank, it adds nothing). y [rows,
// H] f32, or the k_splits partial sums of it split_stride floats apart (added first, in order).
struct Fp8FinalizeArgs {
  const float* y = nullptr;
  int64_t k_splits = 1;
  int64_t split_stride = 0;
  const int32_t* pair_row = nullptr;
  const float* topk_weights = nullptr;
  int64_t num_tokens = 0, top_k = 0, hidden = 0;
  uint16_t* out = nullptr;
  bool skip_negative_ids = false;
  const int32_t* topk_ids = nullptr;  // [M, k] i32, with skip_negative_ids
};
Status fp8_finalize(const Fp8FinalizeArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
