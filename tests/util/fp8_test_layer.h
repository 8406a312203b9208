// A small layer in an fp8 scheme for the tests: random f32 weights quantized
// (io::quantize_fp8) part by part as a checkpoint stores them, inputs, logits
// and, for static activation scales, a calibration pass; plus what the fp64
// reference needs (unquantized values, bytes, scales).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "moekit/config.h"
#include "moekit/io.h"
#include "moekit/kernel.h"
#include "moekit/tensor.h"
#include "reference/reference.h"
#include "util/test_util.h"

namespace moekit::testing {

enum class Fp8Scheme { kBlock128, kTensorDynamic, kTensorStatic };
inline const char* fp8_scheme_name(Fp8Scheme s) {
  switch (s) {
    case Fp8Scheme::kBlock128: return "block128";
    case Fp8Scheme::kTensorDynamic: return "tensor_dynamic";
    case Fp8Scheme::kTensorStatic: return "tensor_static";
  }
  return "?";
}

struct Fp8Shape {
  int64_t M, E, k, H, I;
};

// A layer with fp8 weights quantized (io::quantize_fp8) from random f32 ones.
struct Fp8Layer {
  MoeConfig config;
  HostTensor w13, w2, w13_scale, w2_scale, a13_scale, a2_scale, hidden, logits;
  std::vector<double> w13_exact, w2_exact, hidden_exact, logits_exact;  // unquantized values

  Fp8Layer(const Fp8Shape& s, Fp8Scheme scheme, Activation act, DType dtype, uint64_t seed) {
    config.num_experts = s.E;
    config.hidden = s.H;
    config.intermediate = s.I;
    config.max_num_tokens = s.M;
    config.logits_dtype = DType::kF32;
    config.quant.weight_dtype = DType::kF8E4M3;
    config.quant.act_dtype = dtype;
    config.quant.method = scheme == Fp8Scheme::kBlock128 ? QuantMethod::kFp8Block128 : QuantMethod::kFp8PerTensor;
    config.quant.act_scale = scheme == Fp8Scheme::kTensorStatic ? ActScale::kStatic : ActScale::kDynamic;
    config.activation.kind = act;
    config.routing.method = RoutingMethod::kRenormalize;
    config.routing.top_k = static_cast<int>(s.k);
    std::mt19937_64 rng(seed);
    const int64_t P = act == Activation::kRelu2 ? 1 : 2, n1 = P * s.I;
    const HostTensor w13_f = moekit::testing::random_tensor(rng, DType::kF32, {s.E, n1, s.H}, 1.0 / std::sqrt(double(s.H)), &w13_exact);
    const HostTensor w2_f = moekit::testing::random_tensor(rng, DType::kF32, {s.E, s.H, s.I}, 1.0 / std::sqrt(double(s.I)), &w2_exact);
    w13 = HostTensor(DType::kF8E4M3, {s.E, n1, s.H});
    w2 = HostTensor(DType::kF8E4M3, {s.E, s.H, s.I});
    const bool block = scheme == Fp8Scheme::kBlock128;
    const auto blocks = [](int64_t n) { return (n + 127) / 128; };
    w13_scale = block ? HostTensor(DType::kF32, {s.E, P * blocks(s.I), blocks(s.H)}) : HostTensor(DType::kF32, {s.E, P});
    w2_scale = block ? HostTensor(DType::kF32, {s.E, blocks(s.H), blocks(s.I)}) : HostTensor(DType::kF32, {s.E});
    // Each part (gate, up, down) quantized on its own, as a checkpoint stores them.
    const auto put = [&](const HostTensor& src, int64_t row0, int64_t rows, int64_t cols, HostTensor& q,
                         float* scale_out) {
      const TensorView part = TensorView::contiguous(const_cast<float*>(src.data<float>()) + row0 * cols, DType::kF32,
                                                     {rows, cols});
      StatusOr<io::Fp8Matrix> m = io::quantize_fp8(part, config.quant.method, "test");
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      std::memcpy(q.data<uint8_t>() + row0 * cols, m->weight.data<uint8_t>(), rows * cols);
      std::memcpy(scale_out, m->scale.data<float>(), m->scale.nbytes());
    };
    const int64_t s13 = w13_scale.numel() / s.E / P, s2 = w2_scale.numel() / s.E;
    for (int64_t e = 0; e < s.E; ++e) {
      for (int64_t p = 0; p < P; ++p) {
        put(w13_f, (e * P + p) * s.I, s.I, s.H, w13, w13_scale.data<float>() + (e * P + p) * s13);
      }
      put(w2_f, e * s.H, s.H, s.I, w2, w2_scale.data<float>() + e * s2);
    }
    hidden = moekit::testing::random_tensor(rng, dtype, {s.M, s.H}, 1.0, &hidden_exact);
    logits = moekit::testing::tie_free_logits(rng, DType::kF32, s.M, s.E, 1.0 / 32.0, &logits_exact);
    if (scheme == Fp8Scheme::kTensorStatic) calibrate_static_scales(s, act, rng);
  }

  // Static scales as a calibration pass would set them: each expert's largest
  // |input| of each GEMM over this batch (unquantized), times a per-expert
  // margin in [1, 1.25], over 448 (silu and relu2 only).
  void calibrate_static_scales(const Fp8Shape& s, Activation act, std::mt19937_64& rng) {
    const int64_t P = act == Activation::kRelu2 ? 1 : 2;
    std::vector<double> amax1(s.E, 0.0), amax2(s.E, 0.0);
    for (int64_t t = 0; t < s.M; ++t) {
      for (int64_t e = 0; e < s.E; ++e) {
        for (int64_t c = 0; c < s.H; ++c) amax1[e] = std::max(amax1[e], std::fabs(hidden_exact[t * s.H + c]));
        for (int64_t i = 0; i < s.I; ++i) {
          double z[2] = {0.0, 0.0};
          for (int64_t p = 0; p < P; ++p) {
            for (int64_t c = 0; c < s.H; ++c) {
              z[p] += w13_exact[((e * P + p) * s.I + i) * s.H + c] * hidden_exact[t * s.H + c];
            }
          }
          const double a = act == Activation::kRelu2 ? std::max(z[0], 0.0) * std::max(z[0], 0.0)
                                                     : z[0] / (1.0 + std::exp(-z[0])) * z[1];
          amax2[e] = std::max(amax2[e], std::fabs(a));
        }
      }
    }
    a13_scale = HostTensor(DType::kF32, {s.E});
    a2_scale = HostTensor(DType::kF32, {s.E});
    std::uniform_real_distribution<double> margin(1.0, 1.25);
    for (int64_t e = 0; e < s.E; ++e) {
      a13_scale.data<float>()[e] = static_cast<float>(amax1[e] * margin(rng) / 448.0);
      a2_scale.data<float>()[e] = static_cast<float>(amax2[e] * margin(rng) / 448.0);
    }
  }
  MoeWeights weights() const {
    MoeWeights w{.w13 = w13.view(), .w2 = w2.view(), .w13_scale = w13_scale.view(), .w2_scale = w2_scale.view()};
    if (a13_scale.numel() > 0 && !a13_scale.shape().empty()) {
      w.a13_scale = a13_scale.view();
      w.a2_scale = a2_scale.view();
    }
    return w;
  }
  moekit_ref::Fp8Params ref_params() const {
    moekit_ref::Fp8Params q;
    q.scheme = config.quant.method == QuantMethod::kFp8Block128 ? "block128" : "per_tensor";
    q.static_act = config.quant.act_scale == ActScale::kStatic;
    if (q.static_act) {
      q.a13_scale = moekit::testing::to_double(a13_scale.view());
      q.a2_scale = moekit::testing::to_double(a2_scale.view());
    }
    return q;
  }
  std::vector<uint8_t> bytes(const HostTensor& t) const {
    return std::vector<uint8_t>(t.data<uint8_t>(), t.data<uint8_t>() + t.numel());
  }
};

}  // namespace moekit::testing
