// Conversions of prepared 4-bit expert weights (weight4_streaming_gemm.h's
// layout) on the device, for the 4-bit pipeline's large-M paths
// (moe_pipeline_weight4.h): the weights dequantized to bf16 (the bf16
// tensor-core grouped GEMM then runs on them, a chunk of experts at a time),
// and the scales as bf16 in plain row order (the mixed-input GEMM reads them).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

struct Weight4DequantArgs {
  QuantMethod method = QuantMethod::kMxfp4;
  int64_t num_experts = 0;        // experts [first_expert, first_expert + num_experts)
  int64_t first_expert = 0;
  int64_t n = 0;                  // rows per expert, a multiple of 32
  int64_t k = 0;                  // columns, a multiple of the scale group
  const uint8_t* packed = nullptr;  // [E, n, k/2] of all experts (int4 in two's complement)
  const void* scales = nullptr;     // [E, k/group, n] prepared (weight4_scale_position), of all experts
  uint16_t* out = nullptr;          // [num_experts, n, k] bf16 bits
};

// out = bf16(value * scale): exact for mxfp4 (a power of two times an e2m1
// value, within bf16's range), rounded once to nearest-even for int4's f32 scales.
Status dequantize_weight4(const Weight4DequantArgs& args, cudaStream_t stream);

// out [num_experts, k/group, n] bf16 = the experts' prepared scales (u8 E8M0 or
// f32) with row r taken from weight4_scale_position(r): 2^(code - 127) exactly
// for mxfp4, int4's f32 scale rounded to nearest-even bf16 (exact for the bf16
// scales checkpoints carry). `packed` is not read.
Status weight4_bf16_scales(const Weight4DequantArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
