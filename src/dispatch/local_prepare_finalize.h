// Local (single-rank) PrepareFinalize (docs/design.md §1): no token movement between
// ranks; prepare widens the activations to the fp32 the experts stage reads,
// finalize writes the fp32 layer output back in the activation dtype. The
// weighted top-k reduce is done by the experts stage, in its fixed order.
#pragma once

#include "moekit/tensor.h"

namespace moekit::dispatch {

// hidden: [M, H] f32|bf16, validated by the caller. Returns the [M, H] f32 rows
// the experts stage reads: hidden's own data when it is f32 (no copy), else
// `scratch` ([M, H] f32) filled with the exact widened values.
const float* local_prepare(const TensorView& hidden, float* scratch);

// out: [M, H] f32|bf16. Where the experts stage writes its fp32 result: out's
// own data when it is f32, else `scratch` ([M, H] f32).
float* local_output_buffer(const TensorView& out, float* scratch);

// Writes y ([M, H] f32, from local_output_buffer) into out: bf16 rounds to
// nearest even; f32 is already in place.
void local_finalize(const float* y, const TensorView& out);

}  // namespace moekit::dispatch
