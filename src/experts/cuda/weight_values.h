// The device half of check_weight_values (experts/quant_weights.h): weights a
// caller hands over already on the GPU are checked there, without a host copy.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::cuda {

// Every element of a contiguous device tensor (f32, bf16, f16 or f8_e4m3) is
// finite: the error (check_weight_values's, naming the first bad index) when one
// is not. Host, undefined or non-contiguous views and other dtypes pass (shape
// checks refuse what they must). Synchronous: prepare time only.
Status check_device_weight_values(const TensorView& weight, const char* name);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
