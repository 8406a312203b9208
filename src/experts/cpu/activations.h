// The expert activations, fp32, applied row by row to the GEMM1 output.
#pragma once

#include <cstdint>

#include "moekit/config.h"

namespace moekit::cpu {

// Width of a GEMM1 output row: 2I for the gated activations, I for relu2.
int64_t gemm1_width(Activation kind, int64_t intermediate);

// In place: for each of `rows` rows of `h` (row stride gemm1_width), writes the
// I activated values over the row's first I columns; GEMM2 then reads them with
// the same row stride. Row layouts (what GEMM1 produced from w13):
//   kSiluGated:  [gate 0..I) [up I..2I)   -> silu(gate) * up
//   kGeluGated:  [gate 0..I) [up I..2I)   -> gelu_tanh(gate) * up, where
//                gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//                (the tanh approximation, as the gated-gelu MoE checkpoints use)
//   kSwigluOai:  gate at 2i, up at 2i+1   -> g = min(gate, limit), u = clamp(up, -limit, limit),
//                                            g * sigmoid(alpha * g) * (u + 1)   (gpt-oss)
//   kRelu2:      [x 0..I)                  -> max(x, 0)^2
// In-place is safe: output column i only depends on input columns >= i.
void apply_activation(const ActivationConfig& cfg, float* h, int64_t rows, int64_t intermediate);

}  // namespace moekit::cpu
