// fp64 reference of the fp8 W8A8 schemes. Its e4m3 rounding searches a table
// of every finite e4m3fn value (no bit tricks), so it shares no method with the
// backends' conversion; only the scheme's definition is common.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference.h"
#include "reference_internal.h"

namespace moekit_ref {
namespace {

constexpr double kMax = 448.0;
constexpr int64_t kBlock = 128;

// The non-negative finite e4m3fn values, ascending; index == code (0x00..0x7e).
const std::vector<double>& e4m3_table() {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (int code = 0; code < 0x7f; ++code) t.push_back(e4m3_value(static_cast<uint8_t>(code)));
    return t;
  }();
  return table;
}

// The f32 a backend holds for a value it computed in f32 from f32 operands
// (one IEEE operation): fp64's result rounded once more to f32 is that value,
// since fp64 carries more than 2*24+2 bits (double rounding is innocuous).
double as_f32(double v) { return static_cast<double>(static_cast<float>(v)); }

// The activation scale of a group whose largest |x| is amax (an f32).
double act_scale(double amax) {
  const double floor = static_cast<double>(1e-10f);
  return as_f32(std::max(amax, floor) / kMax);
}

double quant(double x, double scale) { return e4m3_round(as_f32(x / scale)) * scale; }

double amax_of(const double* x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// In place: a row of n values through e4m3, per 128-column group.
void quant_groups(double* x, int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += kBlock) {
    const int64_t len = std::min(kBlock, n - c0);
    const double s = act_scale(amax_of(x + c0, len));
    for (int64_t i = 0; i < len; ++i) x[c0 + i] = quant(x[c0 + i], s);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

double e4m3_value(uint8_t bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 15, man = bits & 7;
  if (exp == 15 && man == 7) return std::nan("");
  const double mag = exp == 0 ? man * std::pow(2.0, -9) : (1.0 + man / 8.0) * std::pow(2.0, exp - 7);
  return sign ? -mag : mag;
}

double e4m3_round(double v) {
  if (std::isnan(v)) return v;
  const double a = std::fabs(v);
  const std::vector<double>& t = e4m3_table();
  double r;
  if (a >= kMax) {
    r = kMax;
  } else {
    const size_t hi = std::upper_bound(t.begin(), t.end(), a) - t.begin();  // t[hi-1] <= a < t[hi]
    const size_t lo = hi - 1;
    const double dlo = a - t[lo], dhi = t[hi] - a;
    r = dlo < dhi ? t[lo] : dhi < dlo ? t[hi] : (lo % 2 == 0 ? t[lo] : t[hi]);
  }
  return std::signbit(v) ? -r : r;
}

std::vector<double> moe_layer_fp8(const LayerParams& p, const Fp8Params& q, const std::vector<double>& hidden,
                                  int64_t M, const std::vector<uint8_t>& w13_bits,
                                  const std::vector<double>& w13_scale, const std::vector<uint8_t>& w2_bits,
                                  const std::vector<double>& w2_scale, const std::vector<int32_t>& ids,
                                  const std::vector<double>& weights, int top_k) {
  const bool block = q.scheme == "block128";
  if (!block && q.scheme != "per_tensor") throw std::invalid_argument("moe_layer_fp8: unknown scheme " + q.scheme);
  const int64_t E = p.E, H = p.H, I = p.I;
  const int64_t parts = p.activation == "relu2" ? 1 : 2, n1 = parts * I;

  // Real weights: byte value times the scale of its block (or part).
  std::vector<double> w13(E * n1 * H), w2(E * H * I);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < n1; ++r) {
      const int64_t part = r / I, rr = r % I;
      for (int64_t c = 0; c < H; ++c) {
        const double s = block ? w13_scale[((e * parts + part) * ceil_div(I, kBlock) + rr / kBlock) * ceil_div(H, kBlock) + c / kBlock]
                               : w13_scale[e * parts + part];
        w13[(e * n1 + r) * H + c] = e4m3_value(w13_bits[(e * n1 + r) * H + c]) * s;
      }
    }
    for (int64_t r = 0; r < H; ++r) {
      for (int64_t c = 0; c < I; ++c) {
        const double s = block ? w2_scale[(e * ceil_div(H, kBlock) + r / kBlock) * ceil_div(I, kBlock) + c / kBlock]
                               : w2_scale[e];
        w2[(e * H + r) * I + c] = e4m3_value(w2_bits[(e * H + r) * I + c]) * s;
      }
    }
  }

  // GEMM1 input per (token, slot), quantized; GEMM1 and the activation.
  const double tensor_scale1 = act_scale(amax_of(hidden.data(), M * H));
  std::vector<double> acts(M * top_k * I);  // [M * k, I]
  for (int64_t t = 0; t < M; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      if (e < 0 || e >= E) throw std::out_of_range("moe_layer_fp8: expert id out of range");
      std::vector<double> x(hidden.begin() + t * H, hidden.begin() + (t + 1) * H);
      if (block) {
        quant_groups(x.data(), H);
      } else {
        const double s = q.static_act ? q.a13_scale[e] : tensor_scale1;
        for (double& v : x) v = quant(v, s);
      }
      std::vector<double> z(n1, 0.0);
      for (int64_t r = 0; r < n1; ++r) {
        double acc = 0.0;
        for (int64_t c = 0; c < H; ++c) acc += w13[(e * n1 + r) * H + c] * x[c];
        z[r] = acc;
      }
      const std::vector<double> a = activate(p, z);
      std::copy(a.begin(), a.end(), acts.begin() + (t * top_k + j) * I);
    }
  }

  // GEMM2 input quantized (per tensor: one amax over every (token, slot) row);
  // GEMM2; weighted sum over the slots.
  const double tensor_scale2 = act_scale(as_f32(amax_of(acts.data(), M * top_k * I)));
  std::vector<double> out(M * H, 0.0);
  for (int64_t t = 0; t < M; ++t) {
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      double* a = &acts[(t * top_k + j) * I];
      if (block) {
        quant_groups(a, I);
      } else {
        const double s = q.static_act ? q.a2_scale[e] : tensor_scale2;
        for (int64_t i = 0; i < I; ++i) a[i] = quant(a[i], s);
      }
      for (int64_t h = 0; h < H; ++h) {
        double acc = 0.0;
        for (int64_t i = 0; i < I; ++i) acc += w2[(e * H + h) * I + i] * a[i];
        out[t * H + h] += weights[t * top_k + j] * acc;
      }
    }
  }
  return out;
}

}  // namespace moekit_ref
