// The activations of config.h in fp32 on the device, shared by every GEMM
// epilogue and any unfused path, so fused and unfused results are the same.
// NaN propagates (a NaN never becomes a clamp bound or a zero).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "moekit/config.h"

namespace moekit::cuda {

struct ActivationParams {
  Activation kind = Activation::kSiluGated;
  float swiglu_limit = 7.0f;
  float swiglu_alpha = 1.702f;
};

__device__ __forceinline__ float sigmoid_act(float x) { return 1.0f / (1.0f + expf(-x)); }

// Gated kinds: act(gate) * up (swiglu_oai: clamped, (up + 1)).
__device__ __forceinline__ float gated_activation(const ActivationParams& a, float gate, float up) {
  switch (a.kind) {
    case Activation::kSiluGated:
      return gate * sigmoid_act(gate) * up;
    case Activation::kGeluGated: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      const float inner = kSqrt2OverPi * (gate + 0.044715f * gate * gate * gate);
      return 0.5f * gate * (1.0f + tanhf(inner)) * up;
    }
    case Activation::kSwigluOai: {
      const float g = gate > a.swiglu_limit ? a.swiglu_limit : gate;
      float u = up > a.swiglu_limit ? a.swiglu_limit : up;
      u = u < -a.swiglu_limit ? -a.swiglu_limit : u;
      return g * sigmoid_act(a.swiglu_alpha * g) * (u + 1.0f);
    }
    case Activation::kRelu2:
      return 0.0f;  // not gated: see plain_activation
  }
  return 0.0f;
}

// Non-gated kinds (relu2): relu(x)^2.
__device__ __forceinline__ float plain_activation(const ActivationParams& a, float x) {
  switch (a.kind) {
    case Activation::kRelu2: {
      const float r = x > 0.0f ? x : (isnan(x) ? x : 0.0f);
      return r * r;
    }
    case Activation::kSiluGated:
    case Activation::kGeluGated:
    case Activation::kSwigluOai:
      return x;  // gated kinds use gated_activation
  }
  return x;
}

// f(std::integral_constant<Activation, K>{}) for the runtime kind: one branch
// per activation, in which the kind is a constant, so the formulas above fold
// to that activation's alone. (A switch on a derived value, such as the gate/up
// layout, leaves every formula of that layout in each branch: larger kernels,
// measurably slower launches at decode sizes.)
template <typename F>
__device__ __forceinline__ void with_activation(Activation kind, F&& f) {
  switch (kind) {
    case Activation::kSiluGated: return f(std::integral_constant<Activation, Activation::kSiluGated>{});
    case Activation::kGeluGated: return f(std::integral_constant<Activation, Activation::kGeluGated>{});
    case Activation::kSwigluOai: return f(std::integral_constant<Activation, Activation::kSwigluOai>{});
    case Activation::kRelu2: return f(std::integral_constant<Activation, Activation::kRelu2>{});
  }
}

}  // namespace moekit::cuda
