#include "dispatch/local_prepare_finalize.h"

#include "moekit/parallel_for.h"

namespace moekit::dispatch {

const float* local_prepare(const TensorView& hidden, float* scratch) {
  if (hidden.dtype == DType::kF32) return hidden.ptr<const float>();
  const uint16_t* src = hidden.ptr<const uint16_t>();  // bf16 bits
  parallel_for(hidden.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) scratch[i] = bf16_bits_to_f32(src[i]);
  });
  return scratch;
}

float* local_output_buffer(const TensorView& out, float* scratch) {
  return out.dtype == DType::kF32 ? out.ptr<float>() : scratch;
}

void local_finalize(const float* y, const TensorView& out) {
  if (out.dtype == DType::kF32) return;
  uint16_t* dst = out.ptr<uint16_t>();  // bf16 bits
  parallel_for(out.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = f32_to_bf16_bits(y[i]);
  });
}

}  // namespace moekit::dispatch
