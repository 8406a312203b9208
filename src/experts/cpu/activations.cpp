#include "experts/cpu/activations.h"

#include <algorithm>
#include <cmath>

#include "moekit/parallel_for.h"

namespace moekit::cpu {
namespace {

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

inline float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
}

void silu_row(float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = h[i] * sigmoid(h[i]) * h[n + i];
}
void gelu_row(float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = gelu_tanh(h[i]) * h[n + i];
}
void swiglu_oai_row(float* h, int64_t n, float limit, float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(h[2 * i], limit);
    const float u = std::clamp(h[2 * i + 1], -limit, limit);
    h[i] = g * sigmoid(alpha * g) * (u + 1.0f);
  }
}
void relu2_row(float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::max(h[i], 0.0f);
    h[i] = r * r;
  }
}

}  // namespace

int64_t gemm1_width(Activation kind, int64_t intermediate) {
  return gate_up_layout(kind) == GateUpLayout::kNotGated ? intermediate : 2 * intermediate;
}

void apply_activation(const ActivationConfig& cfg, float* h, int64_t rows, int64_t intermediate) {
  const int64_t ld = gemm1_width(cfg.kind, intermediate);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, intermediate));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = h + r * ld;
      switch (cfg.kind) {
        case Activation::kSiluGated: silu_row(row, intermediate); break;
        case Activation::kGeluGated: gelu_row(row, intermediate); break;
        case Activation::kSwigluOai: swiglu_oai_row(row, intermediate, cfg.swiglu_limit, cfg.swiglu_alpha); break;
        case Activation::kRelu2: relu2_row(row, intermediate); break;
      }
    }
  });
}

}  // namespace moekit::cpu
