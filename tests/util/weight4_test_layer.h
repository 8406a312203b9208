// A small layer with 4-bit expert weights for the tests (docs/weights_4bit.md):
// random packed bytes and scales as a checkpoint stores them, biases, inputs
// and logits, plus the fp64 reference decoder's values of every weight.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/weight4.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/tensor.h"
#include "reference/reference.h"
#include "util/test_util.h"

namespace moekit::testing {

inline std::string ref_scheme(QuantMethod m) { return m == QuantMethod::kMxfp4 ? "mxfp4" : "int4"; }

// Random packed bytes and scales of a [rows, cols] weight: every nibble
// equally likely; E8M0 codes in [127 - 7, 127 - 3] or int4 scales in
// [0.004, 0.02] (values of the size a layer's weights have).
struct Packed {
  HostTensor bytes, scales;
};
inline Packed random_packed(std::mt19937_64& rng, QuantMethod m, std::vector<int64_t> shape) {
  const int64_t cols = shape.back(), g = weight4_group(m);
  std::vector<int64_t> packed_shape = shape, scale_shape = shape;
  packed_shape.back() = cols / 2;
  scale_shape.back() = cols / g;
  Packed p{HostTensor(DType::kU8, packed_shape), HostTensor(weight4_scale_dtype(m), scale_shape)};
  std::uniform_int_distribution<int> byte(0, 255), code(127 - 7, 127 - 3);
  std::uniform_real_distribution<float> scale(0.004f, 0.02f);
  for (int64_t i = 0; i < p.bytes.numel(); ++i) p.bytes.data<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < p.scales.numel(); ++i) {
    if (m == QuantMethod::kMxfp4) {
      p.scales.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
    } else {
      p.scales.data<float>()[i] = scale(rng);
    }
  }
  return p;
}

inline std::vector<uint8_t> bytes_of(const HostTensor& t) {
  return std::vector<uint8_t>(t.data<uint8_t>(), t.data<uint8_t>() + t.nbytes());
}

// The reference decoder's values of a packed weight (its scales widened to double).
inline std::vector<double> weight_values(QuantMethod m, const Packed& p) {
  const int64_t cols = 2 * p.bytes.shape().back(), rows = p.bytes.numel() / p.bytes.shape().back();
  std::vector<double> scales = m == QuantMethod::kMxfp4 ? std::vector<double>(p.scales.data<uint8_t>(),
                                                                              p.scales.data<uint8_t>() + p.scales.numel())
                                                        : to_double(p.scales.view());
  return moekit_ref::weight4_values(ref_scheme(m), bytes_of(p.bytes), scales, rows, cols, weight4_group(m));
}

struct Weight4Shape {
  int64_t M, E, k, H, I;
};

struct Weight4Layer {
  MoeConfig config;
  Packed w13, w2;
  HostTensor w13_bias, w2_bias, hidden, logits;
  std::vector<double> w13_exact, w2_exact, b13_exact, b2_exact, hidden_exact, logits_exact;

  Weight4Layer(const Weight4Shape& s, QuantMethod m, Activation act, bool biases, DType act_dtype, uint64_t seed) {
    config.num_experts = s.E;
    config.hidden = s.H;
    config.intermediate = s.I;
    config.max_num_tokens = s.M;
    config.logits_dtype = DType::kF32;
    config.quant.method = m;
    config.quant.weight_dtype = DType::kU8;
    config.quant.act_dtype = act_dtype;
    config.activation.kind = act;
    config.has_expert_bias = biases;
    config.routing.method = RoutingMethod::kRenormalize;
    config.routing.top_k = static_cast<int>(s.k);
    std::mt19937_64 rng(seed);
    const int64_t n1 = (act == Activation::kRelu2 ? 1 : 2) * s.I;
    w13 = random_packed(rng, m, {s.E, n1, s.H});
    w2 = random_packed(rng, m, {s.E, s.H, s.I});
    w13_exact = weight_values(m, w13);
    w2_exact = weight_values(m, w2);
    if (biases) {
      w13_bias = random_tensor(rng, DType::kBF16, {s.E, n1}, 0.1, &b13_exact);
      w2_bias = random_tensor(rng, DType::kF32, {s.E, s.H}, 0.1, &b2_exact);
    }
    hidden = random_tensor(rng, act_dtype, {s.M, s.H}, 1.0, &hidden_exact);
    logits = tie_free_logits(rng, DType::kF32, s.M, s.E, 1e-3, &logits_exact);
  }
  MoeWeights weights() const {
    MoeWeights w;
    w.w13 = w13.bytes.view();
    w.w2 = w2.bytes.view();
    w.w13_scale = w13.scales.view();
    w.w2_scale = w2.scales.view();
    if (config.has_expert_bias) {
      w.w13_bias = w13_bias.view();
      w.w2_bias = w2_bias.view();
    }
    return w;
  }
};

}  // namespace moekit::testing
