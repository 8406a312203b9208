// Independent fp64 truth for routing and the whole MoE layer. Shares no code
// with any moekit backend: plain std::vector<double>, its own names, its own
// loops. Every backend is checked against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit_ref {

struct RoutingParams {
  std::string method;  // softmax_topk | renormalize | renormalize_naive | topk | sigmoid |
                       // sigmoid_renorm | llama4 | deepseek_v3
  int top_k = 1;
  int num_groups = 1;     // deepseek_v3
  int topk_groups = 1;    // deepseek_v3
  double scaling = 1.0;   // deepseek_v3 routed_scaling_factor
  bool renormalize = true;  // deepseek_v3 norm_topk_prob: divide by the sum before scaling
  std::vector<double> bias;  // deepseek_v3 e_score_correction_bias [E], empty = none
};

struct RoutingResult {
  std::vector<int32_t> ids;     // [M, k], spec order
  std::vector<double> weights;  // [M, k]
  std::vector<int32_t> counts;  // [E] tokens routed to each expert
};

// logits: [M, E] row-major (already the fp32 values the backend sees, widened).
// forced_ids: empty, or [M, k]: selection skipped, weights computed for these ids.
RoutingResult route(const RoutingParams& p, const std::vector<double>& logits, int64_t M, int64_t E,
                    const std::vector<int32_t>& forced_ids = {});

struct LayerParams {
  std::string activation;  // silu | gelu | swiglu_oai | relu2
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  int64_t E = 0, H = 0, I = 0;
};

// hidden [M, H]; w13 [E, 2I, H] (relu2: [E, I, H]); w2 [E, H, I]; ids/weights [M, k].
// Returns out [M, H] = sum_j w[t,j] * W2[e] act(W13[e] x_t), all in fp64.
std::vector<double> moe_layer(const LayerParams& p, const std::vector<double>& hidden, int64_t M,
                              const std::vector<double>& w13, const std::vector<double>& w2,
                              const std::vector<int32_t>& ids, const std::vector<double>& weights, int top_k);

// Terms some families add to the routed experts; every empty vector is absent.
struct LayerExtras {
  std::vector<double> b13;  // [E, rows of W13[e]]: added to W13[e] x before the activation
  std::vector<double> b2;   // [E, H]: added to each expert's output
  int64_t shared_I = 0;     // > 0: a shared expert of this width on every token
  std::vector<double> shared_w13;   // [2 shared_I, H] (relu2: [shared_I, H]), same row layout as W13
  std::vector<double> shared_w2;    // [H, shared_I]
  std::vector<double> shared_gate;  // [H]: shared output times sigmoid(gate . x_t)
};

// moe_layer with the extras: expert_e(x) = W2[e] act(W13[e] x + b13[e]) + b2[e];
// out[t] = sum_j w[t,j] * expert_{ids[t,j]}(x_t) + g_t * shared(x_t).
std::vector<double> moe_layer(const LayerParams& p, const std::vector<double>& hidden, int64_t M,
                              const std::vector<double>& w13, const std::vector<double>& w2,
                              const std::vector<int32_t>& ids, const std::vector<double>& weights, int top_k,
                              const LayerExtras& extras);
// ---- fp8 (e4m3fn) W8A8, emulated independently of every backend.

// The e4m3fn value nearest to v (ties to the even code), saturating at +-448
// (finite values never become NaN); NaN stays NaN.
double e4m3_round(double v);
// The value of an e4m3fn byte (0x7f/0xff: NaN).
double e4m3_value(uint8_t bits);

struct Fp8Params {
  std::string scheme;         // "block128" | "per_tensor"
  bool static_act = false;    // per_tensor: activation scales given (a13_scale, a2_scale), else dynamic
  std::vector<double> a13_scale, a2_scale;  // [E], static_act only
};

// The MoE layer with e4m3 weights and activations, in fp64 apart from the
// rounding the scheme specifies (docs/fp8.md): weights = e4m3 byte * scale;
// each GEMM input rounded to e4m3 with the scale computed as an f32
// (max(amax, 1e-10f) / 448) and the quotient x / scale taken in f32, per token
// per 128 columns (block128) or per whole GEMM input / per expert
// (per_tensor dynamic / static). w13_bits [E, n1, H], w2_bits [E, H, I] e4m3
// bytes; scales as moekit's MoeWeights (kernel.h): block128 w13_scale
// [E, P*ceil(I/128), ceil(H/128)], w2_scale [E, ceil(H/128), ceil(I/128)];
// per_tensor w13_scale [E, P], w2_scale [E]; P = 2 gated, 1 relu2.
std::vector<double> moe_layer_fp8(const LayerParams& p, const Fp8Params& q, const std::vector<double>& hidden,
                                  int64_t M, const std::vector<uint8_t>& w13_bits, const std::vector<double>& w13_scale,
                                  const std::vector<uint8_t>& w2_bits, const std::vector<double>& w2_scale,
                                  const std::vector<int32_t>& ids, const std::vector<double>& weights, int top_k);

// ---- 4-bit weights (docs/weights_4bit.md), decoded independently of every backend.

// The real values of a [rows, cols] weight stored as packed nibbles
// ([rows, cols/2] bytes, the even column in the low nibble) with one scale per
// `group` columns ([rows, cols/group]):
//   "mxfp4": e2m1 (sign, 2-bit exponent with bias 1, 1-bit mantissa; exponent 0
//            subnormal) times 2^(code - 127), scales given as E8M0 codes;
//   "int4":  (nibble - 8) times the scale (scales given as values).
// Throws on an E8M0 code 255 (NaN).
std::vector<double> weight4_values(const std::string& scheme, const std::vector<uint8_t>& packed,
                                   const std::vector<double>& scales, int64_t rows, int64_t cols, int64_t group);

}  // namespace moekit_ref
