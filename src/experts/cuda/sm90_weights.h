// The cuda_sm90 kernels' prepared weights: device copies of MoeWeights in the
// layouts their pipeline reads, one preparation per pipeline (sm90_support.h).
//   bf16: W13 gate/up block-interleaved (weight_layout.h), W2 as given, the
//         extras (biases widened to f32, a shared expert re-laid-out like W13).
//   fp8:  e4m3 weights in the checkpoint layout, their scales as given and as
//         the tensor-core GEMM reads them (fp8_expand_weight_scales).
//   4-bit: the packed bytes as stored (int4 as two's complement nibbles), W13's rows in the kGateUpBlock order of
//         the bf16 layout; the scales transposed to [E, K/group, N] (rows
//         permuted alike) so the rows of one scale group are contiguous; the
//         biases as for bf16 (weight4_streaming_gemm.h).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include "experts/cuda/moe_pipeline.h"
#include "experts/cuda/moe_pipeline_fp8.h"
#include "experts/cuda/moe_pipeline_weight4.h"
#include "experts/cuda/sm90_support.h"
#include "moekit/config.h"
#include "moekit/device_buffer.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cuda {

struct Sm90Weights {
  DeviceBuffer w13;         // [E, N1, H]: bf16 prepared layout, e4m3 as given, or 4-bit [E, N1, H/2] prepared rows
  DeviceBuffer w2;          // [E, H, I]: bf16 or e4m3, or 4-bit [E, H, I/2]
  DeviceBuffer score_bias;  // [E] f32, deepseek_v3 e_score_correction_bias (monolithic routing), optional
  // fp8: MoeWeights layouts (kernel.h), f32; 4-bit: [E, K/group, N] u8 E8M0 or f32
  DeviceBuffer w13_scale, w2_scale;
  int mxfp4_max_code = 255;  // 4-bit mxfp4: the largest E8M0 code of both scale tensors
  // fp8 only:
  DeviceBuffer w13_gemm_scale, w2_gemm_scale;  // Fp8ExpertWeights layouts
  DeviceBuffer a13_scale, a2_scale;            // [E] f32, static activation scales, optional
  // bf16 (biases: and 4-bit), iff the config asks for them:
  DeviceBuffer w13_bias;     // [E, N1] f32, prepared column order
  DeviceBuffer w2_bias;      // [E, H] f32
  DeviceBuffer shared_w13;   // [N1s, H] bf16, prepared layout
  DeviceBuffer shared_w2;    // [H, Is] bf16
  DeviceBuffer shared_gate;  // [H] f32
  bool prepared = false;

  // The fp8 pipeline's view of these weights.
  Fp8ExpertWeights fp8(const QuantScheme& quant) const;
  // The 4-bit pipeline's view.
  Weight4ExpertWeights weight4(QuantMethod method) const;
};

// Checks `w` (dtypes, shapes, devices, finite values, the extras the config
// asks for and no others) and prepares it on cuda:device_index, which must be
// current. Refused weights leave *out unprepared (prepared == false).
Status prepare_sm90_weights(const MoeConfig& config, const ExpertsShape& shape, Sm90Pipeline pipeline,
                            int device_index, const char* kernel_name, const MoeWeights& w, Sm90Weights* out);

// The shared expert's tensors alone (shared_w13, shared_w2, shared_gate), checked
// and prepared as above into out->shared_*; the routed weights are not read.
// Expert-parallel GPU ranks run it apart from their experts (sm90_shared_expert.h).
Status prepare_sm90_shared_expert(const ExpertsShape& shape, int device_index, const char* kernel_name,
                                  const MoeWeights& w, Sm90Weights* out);

template <typename T>
T* device_ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
