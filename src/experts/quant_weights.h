// The scale tensors of the fp8 schemes, checked once for every backend
// (MoeWeights in kernel.h has their layouts; docs/fp8.md the conventions).
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit {

// Row parts of w13: 2 (gate, up) when gated, 1 for relu2.
int64_t w13_parts(const ActivationConfig& activation);

// Dtypes and shapes of w13_scale/w2_scale/a13_scale/a2_scale for config.quant:
// present exactly when the scheme needs them, f32, on `device`, the shapes of
// kernel.h. For host tensors the values too: finite and > 0 (4-bit: no E8M0
// NaN, and no weight that overflows f32 with its scale). Errors name the
// tensor (and, for a bad value, its index).
Status check_quant_scales(const MoeConfig& config, const MoeWeights& weights, Device device);

// 4-bit host weights whose value times its scale leaves f32's range
// (check_weight4_range in core/weight4.h), named "w13"/"w2". Device weights pass.
// NOTE: check_quant_scales calls it for host weights; the CUDA backend on its
// host copies of device weights.
Status check_weight4_weights(QuantMethod method, const MoeWeights& weights);

// Values of a host f32 scale tensor: every one finite and > 0.
Status check_scale_values(const TensorView& scale, const char* name);

// Values of a host weight tensor (f32, bf16, f16 or f8_e4m3): every one finite
// (no NaN or Inf; for e4m3, none of the NaN codes 0x7F/0xFF). The error names
// the tensor and the index of the first bad element. Undefined views pass.
// NOTE: the CPU backend calls it in prepare_weights; the CUDA backend too, and
// check_device_weight_values (experts/cuda/weight_values.h) for device tensors.
Status check_weight_values(const TensorView& weight, const char* name);

// The error check_weight_values returns for element `flat_index` of `weight`
// (NaN when `nan`, else infinite): one message for host and device checks.
Status non_finite_weight_error(const TensorView& weight, const char* name, int64_t flat_index, bool nan);

}  // namespace moekit
