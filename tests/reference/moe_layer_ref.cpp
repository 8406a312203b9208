// fp64 reference of the whole MoE layer: plain loops over tokens, slots and
// weight rows. Deliberately naive (no grouping by expert, no BLAS) so that it
// shares no structure with any backend.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference.h"
#include "reference_internal.h"

namespace moekit_ref {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// gelu, tanh approximation (the form gated-gelu MoE models use).
double gelu_tanh(double v) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
}

}  // namespace

// act(z) of length I for z = W13[e] x (2I values gated, I for relu2).
std::vector<double> activate(const LayerParams& p, const std::vector<double>& z) {
  std::vector<double> a(p.I, 0.0);
  for (int64_t i = 0; i < p.I; ++i) {
    if (p.activation == "silu") {
      const double g = z[i], u = z[p.I + i];
      a[i] = g * sigmoid(g) * u;
    } else if (p.activation == "gelu") {
      const double g = z[i], u = z[p.I + i];
      a[i] = gelu_tanh(g) * u;
    } else if (p.activation == "swiglu_oai") {
      // gpt-oss: rows interleaved (2i gate, 2i+1 up).
      double g = z[2 * i], u = z[2 * i + 1];
      g = std::min(g, p.swiglu_limit);
      u = std::max(-p.swiglu_limit, std::min(u, p.swiglu_limit));
      a[i] = g * sigmoid(p.swiglu_alpha * g) * (u + 1.0);
    } else if (p.activation == "relu2") {
      const double r = std::max(z[i], 0.0);
      a[i] = r * r;
    } else {
      throw std::invalid_argument("moe_layer: unknown activation " + p.activation);
    }
  }
  return a;
}

namespace {

// z = W13[e] x (+ b13e) for one token; returns act(z) of length I.
std::vector<double> expert_hidden(const LayerParams& p, const double* x, const double* w13e,
                                  const double* b13e = nullptr) {
  const bool gated = p.activation != "relu2";
  const int64_t rows = gated ? 2 * p.I : p.I;
  std::vector<double> z(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < p.H; ++c) s += w13e[r * p.H + c] * x[c];
    z[r] = b13e != nullptr ? s + b13e[r] : s;
  }
  return activate(p, z);
}

}  // namespace

std::vector<double> moe_layer(const LayerParams& p, const std::vector<double>& hidden, int64_t M,
                              const std::vector<double>& w13, const std::vector<double>& w2,
                              const std::vector<int32_t>& ids, const std::vector<double>& weights, int top_k) {
  return moe_layer(p, hidden, M, w13, w2, ids, weights, top_k, LayerExtras{});
}

std::vector<double> moe_layer(const LayerParams& p, const std::vector<double>& hidden, int64_t M,
                              const std::vector<double>& w13, const std::vector<double>& w2,
                              const std::vector<int32_t>& ids, const std::vector<double>& weights, int top_k,
                              const LayerExtras& extras) {
  const int64_t w13_rows = p.activation == "relu2" ? p.I : 2 * p.I;
  std::vector<double> out(static_cast<size_t>(M * p.H), 0.0);
  for (int64_t t = 0; t < M; ++t) {
    const double* x = &hidden[t * p.H];
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      if (e < 0 || e >= p.E) throw std::out_of_range("moe_layer: expert id out of range");
      const double w = weights[t * top_k + j];
      const double* b13e = extras.b13.empty() ? nullptr : &extras.b13[e * w13_rows];
      const std::vector<double> a = expert_hidden(p, x, &w13[e * w13_rows * p.H], b13e);
      const double* w2e = &w2[e * p.H * p.I];
      for (int64_t h = 0; h < p.H; ++h) {
        double s = extras.b2.empty() ? 0.0 : extras.b2[e * p.H + h];
        for (int64_t i = 0; i < p.I; ++i) s += w2e[h * p.I + i] * a[i];
        out[t * p.H + h] += w * s;
      }
    }
    if (extras.shared_I > 0) {
      LayerParams sp = p;
      sp.I = extras.shared_I;
      const std::vector<double> a = expert_hidden(sp, x, extras.shared_w13.data());
      double g = 1.0;
      if (!extras.shared_gate.empty()) {
        double dot = 0.0;
        for (int64_t c = 0; c < p.H; ++c) dot += extras.shared_gate[c] * x[c];
        g = sigmoid(dot);
      }
      for (int64_t h = 0; h < p.H; ++h) {
        double s = 0.0;
        for (int64_t i = 0; i < sp.I; ++i) s += extras.shared_w2[h * sp.I + i] * a[i];
        out[t * p.H + h] += g * s;
      }
    }
  }
  return out;
}

}  // namespace moekit_ref
