// The terms some families add to the routed experts, on the CPU kernels:
// expert biases (gpt-oss), a shared expert (DeepSeek-V3) and its sigmoid gate
// (Qwen2-MoE). Modular and monolithic agree bitwise; both match the fp64
// reference; a missing, misshapen or unexpected tensor is named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "experts/cpu/cpu_modular.h"
#include "experts/cpu/cpu_monolithic.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit::cpu {
namespace {

using moekit::testing::poison;
using moekit::testing::random_tensor;
using moekit::testing::ref_layer;
using moekit::testing::ref_routing;
using moekit::testing::rel_l2_error;
using moekit::testing::seed_from;
using moekit::testing::tie_free_logits;
using moekit::testing::to_double;

// Normalized error bounds, as in test_cpu_kernels.cpp: f32 is the worst case
// K·2^-24 of a K-term fp32 dot product (K <= 72), with room for the one extra
// fp32 addition of a bias and the shared expert's second GEMM pair; bf16 adds
// the single rounding of the output (2^-8).
constexpr double kF32Bound = 1e-5;
constexpr double kBf16Bound = 0.00390625 * (1.0 + kF32Bound) + kF32Bound;

struct Extras {
  bool bias = false;
  int64_t shared_I = 0;
  bool shared_gate = false;
};

struct Case {
  const char* name;
  Activation act;
  RoutingMethod method;
  bool renormalize;  // deepseek_v3 only
  Extras extras;
};

struct Layer {
  MoeConfig config;
  HostTensor w13, w2, b13, b2, sw13, sw2, sgate, hidden, logits;
  moekit_ref::LayerExtras ref_extras;
  std::vector<double> w13_exact, w2_exact, hidden_exact, logits_exact;

  Layer(const Case& c, DType dtype, int64_t M, int64_t E, int k, int64_t H, int64_t I, uint64_t seed) {
    config.num_experts = E;
    config.hidden = H;
    config.intermediate = I;
    config.max_num_tokens = M;
    config.logits_dtype = dtype;
    config.quant.weight_dtype = dtype;
    config.quant.act_dtype = dtype;
    config.activation.kind = c.act;
    config.routing.method = c.method;
    config.routing.top_k = k;
    if (c.method == RoutingMethod::kDeepseekV3) {
      config.routing.num_groups = 4;
      config.routing.topk_groups = 2;
      config.routing.routed_scaling_factor = 2.5f;
      config.routing.renormalize = c.renormalize;
    }
    config.has_expert_bias = c.extras.bias;
    config.shared_intermediate = c.extras.shared_I;
    config.has_shared_gate = c.extras.shared_gate;
    std::mt19937_64 rng(seed);
    const int64_t n1 = c.act == Activation::kRelu2 ? I : 2 * I;
    w13 = random_tensor(rng, dtype, {E, n1, H}, 1.0 / std::sqrt(double(H)), &w13_exact);
    w2 = random_tensor(rng, dtype, {E, H, I}, 1.0 / std::sqrt(double(I)), &w2_exact);
    if (c.extras.bias) {
      // Biases of the size of the GEMM terms, so a bias added at the wrong
      // place (after the activation, or unweighted) is far outside the bound.
      b13 = random_tensor(rng, dtype, {E, n1}, 1.0, &ref_extras.b13);
      b2 = random_tensor(rng, DType::kF32, {E, H}, 1.0, &ref_extras.b2);
    }
    if (c.extras.shared_I > 0) {
      const int64_t Is = c.extras.shared_I, n1s = c.act == Activation::kRelu2 ? Is : 2 * Is;
      ref_extras.shared_I = Is;
      sw13 = random_tensor(rng, dtype, {n1s, H}, 1.0 / std::sqrt(double(H)), &ref_extras.shared_w13);
      sw2 = random_tensor(rng, dtype, {H, Is}, 1.0 / std::sqrt(double(Is)), &ref_extras.shared_w2);
      if (c.extras.shared_gate) {
        sgate = random_tensor(rng, dtype, {H}, 1.0 / std::sqrt(double(H)), &ref_extras.shared_gate);
      }
    }
    hidden = random_tensor(rng, dtype, {M, H}, 1.0, &hidden_exact);
    logits = tie_free_logits(rng, dtype, M, E, 1.0 / 32.0, &logits_exact);
  }

  MoeWeights weights() const {
    MoeWeights w;
    w.w13 = w13.view();
    w.w2 = w2.view();
    if (config.has_expert_bias) {
      w.w13_bias = b13.view();
      w.w2_bias = b2.view();
    }
    if (config.shared_intermediate > 0) {
      w.shared_w13 = sw13.view();
      w.shared_w2 = sw2.view();
      if (config.has_shared_gate) w.shared_gate = sgate.view();
    }
    return w;
  }
};

struct Workbuf {
  std::vector<unsigned char> bytes;
  explicit Workbuf(size_t n) : bytes(n) {}
  Workspace ws() { return {bytes.data(), bytes.size()}; }
};

const Case kCases[] = {
    {"gpt_oss_biases", Activation::kSwigluOai, RoutingMethod::kRenormalize, true, {true, 0, false}},
    {"silu_biases", Activation::kSiluGated, RoutingMethod::kSoftmaxTopk, true, {true, 0, false}},
    {"deepseek_shared", Activation::kSiluGated, RoutingMethod::kDeepseekV3, true, {false, 48, false}},
    {"deepseek_shared_no_renorm", Activation::kSiluGated, RoutingMethod::kDeepseekV3, false, {false, 24, false}},
    {"qwen2_gated_shared", Activation::kSiluGated, RoutingMethod::kSoftmaxTopk, true, {false, 56, true}},
    {"relu2_all", Activation::kRelu2, RoutingMethod::kSigmoidRenorm, true, {true, 16, true}},
};

class CpuExtras : public ::testing::TestWithParam<std::tuple<int, DType, int64_t>> {};

TEST_P(CpuExtras, ModularEqualsMonolithicAndMatchesReference) {
  const auto [ci, dtype, M] = GetParam();
  const Case& c = kCases[ci];
  const int64_t E = 16, H = 72, I = 40;
  const int k = 4;
  Layer layer(c, dtype, M, E, k, H, I, seed_from({ci, int64_t(dtype), M, 11}));
  ASSERT_TRUE(layer.config.validate().ok()) << layer.config.validate().to_string();

  CpuMonolithic mono(layer.config);
  CpuModular modular(layer.config);
  const Status pm = mono.prepare_weights(layer.weights());
  ASSERT_TRUE(pm.ok()) << pm.to_string();
  ASSERT_TRUE(modular.prepare_weights(layer.weights()).ok());

  HostTensor out_mono(dtype, {M, H}), replay(DType::kI16, {M, k});
  poison(out_mono);
  Workbuf wm(mono.workspace_size(M));
  MoeRunArgs am;
  am.hidden = layer.hidden.view();
  am.out = out_mono.view();
  am.router_logits = layer.logits.view();
  am.routing_replay_out = replay.view();
  const Status sm = mono.run(am, wm.ws(), nullptr);
  ASSERT_TRUE(sm.ok()) << sm.to_string();

  HostTensor ids(DType::kI32, {M, k}), wts(DType::kF32, {M, k}), out_mod(dtype, {M, H});
  RoutingArgs ra;
  ra.logits = layer.logits.view();
  ra.topk_ids = ids.view();
  ra.topk_weights = wts.view();
  ASSERT_TRUE(route_cpu(layer.config.routing, ra).ok());
  poison(out_mod);
  Workbuf wd(modular.workspace_size(M));
  MoeRunArgs ad;
  ad.hidden = layer.hidden.view();
  ad.out = out_mod.view();
  ad.topk_ids = ids.view();
  ad.topk_weights = wts.view();
  ASSERT_TRUE(modular.run(ad, wd.ws(), nullptr).ok());
  EXPECT_EQ(std::memcmp(out_mono.data<unsigned char>(), out_mod.data<unsigned char>(), out_mono.nbytes()), 0)
      << "modular and monolithic outputs differ";

  // Capture records the routed ids only (the shared expert is not an id).
  const moekit_ref::RoutingResult rr = moekit_ref::route(ref_routing(layer.config.routing), layer.logits_exact, M, E);
  const std::vector<double> captured = to_double(replay.view());
  for (int64_t i = 0; i < M * k; ++i) ASSERT_EQ(captured[i], rr.ids[i]) << "pair " << i;
  const std::vector<double> ref = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, M,
                                                        layer.w13_exact, layer.w2_exact, rr.ids, rr.weights, k,
                                                        layer.ref_extras);
  EXPECT_LE(rel_l2_error(to_double(out_mono.view()), ref), dtype == DType::kF32 ? kF32Bound : kBf16Bound);
  // The extras matter: the layer without them is far from the reference.
  const std::vector<double> plain = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, M,
                                                          layer.w13_exact, layer.w2_exact, rr.ids, rr.weights, k);
  EXPECT_GT(rel_l2_error(plain, ref), 0.05) << "the case does not exercise its extras";
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuExtras,
                         ::testing::Combine(::testing::Range(0, int(std::size(kCases))),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values<int64_t>(1, 33)),
                         [](const auto& info) {
                           return std::string(kCases[std::get<0>(info.param)].name) + "_" +
                                  dtype_name(std::get<1>(info.param)) + "_M" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Each extra tensor: required with its flag, refused without it, shape named.
TEST(CpuExtrasBadInput, TensorsNamed) {
  const Case all{"all", Activation::kSiluGated, RoutingMethod::kSoftmaxTopk, true, {true, 24, true}};
  Layer layer(all, DType::kF32, 5, 8, 2, 16, 12, seed_from({5, 8, 2, 77}));  // n1 = 24 != H
  struct Bad {
    const char* what;
    void (*edit)(MoeConfig&, MoeWeights&, const Layer&);
    const char* message;
  };
  const Bad bad[] = {
      {"missing b13", [](MoeConfig&, MoeWeights& w, const Layer&) { w.w13_bias = {}; }, "w13_bias"},
      {"missing b2", [](MoeConfig&, MoeWeights& w, const Layer&) { w.w2_bias = {}; }, "w2_bias"},
      {"b2 as b13", [](MoeConfig&, MoeWeights& w, const Layer& l) { w.w13_bias = l.b2.view(); }, "w13_bias"},
      {"bias without flag", [](MoeConfig& c, MoeWeights&, const Layer&) { c.has_expert_bias = false; },
       "w13_bias: given, but has_expert_bias is off"},
      {"missing shared w2", [](MoeConfig&, MoeWeights& w, const Layer&) { w.shared_w2 = {}; }, "shared_w2"},
      {"shared w13 transposed", [](MoeConfig&, MoeWeights& w, const Layer& l) { w.shared_w13 = l.sw2.view(); },
       "shared_w13"},
      {"shared without flag",
       [](MoeConfig& c, MoeWeights&, const Layer&) {
         c.shared_intermediate = 0;
         c.has_shared_gate = false;
       },
       "shared_w13: given, but shared_intermediate is off"},
      {"gate without flag", [](MoeConfig& c, MoeWeights&, const Layer&) { c.has_shared_gate = false; },
       "shared_gate: given, but has_shared_gate is off"},
  };
  for (const Bad& b : bad) {
    MoeConfig cfg = layer.config;
    MoeWeights w = layer.weights();
    b.edit(cfg, w, layer);
    CpuModular kernel(cfg);
    const Status s = kernel.prepare_weights(w);
    EXPECT_FALSE(s.ok()) << b.what;
    EXPECT_NE(s.message().find(b.message), std::string::npos) << b.what << ": " << s.message();
  }
  MoeConfig cfg = layer.config;
  cfg.shared_intermediate = 0;  // gate without a shared expert
  EXPECT_NE(cfg.validate().message().find("has_shared_gate"), std::string::npos);
}

}  // namespace
}  // namespace moekit::cpu
