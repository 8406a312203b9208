// Expert biases (gpt-oss), shared experts (DeepSeek-V3) and the shared-expert
// gate (Qwen2-MoE) on the H200: Sm90Monolithic and Sm90Modular (routed by the
// layer) agree bit for bit, both match the fp64 reference, and capture holds
// the routed ids only.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "cuda/cuda_test_util.h"
#include "moekit/layer.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using cuda_test::DeviceTensor;

// As test_layer_cuda.cpp's kLayerBound (bf16 roundings of ~2e-3 rms, 5x margin);
// the bias path adds one rounding (GEMM1's output to bf16 before the bias) and
// the shared expert its own intermediate and output roundings: still < 4e-3 rms.
constexpr double kBound = 1e-2;

struct ExtrasCase {
  const char* name;
  int64_t M, E;
  int k;
  Activation act;
  RoutingMethod method;
  int64_t H, I;
  bool bias;
  int64_t shared_I;
  bool shared_gate;
  bool renormalize = true;
};

const ExtrasCase kCases[] = {
    {"gpt_oss_decode", 3, 32, 4, Activation::kSwigluOai, RoutingMethod::kRenormalize, 256, 128, true, 0, false},
    {"gpt_oss_prefill", 2000, 32, 4, Activation::kSwigluOai, RoutingMethod::kRenormalize, 256, 128, true, 0, false},
    {"deepseek_shared", 64, 64, 8, Activation::kSiluGated, RoutingMethod::kDeepseekV3, 256, 64, false, 128, false},
    {"deepseek_shared_large", 3000, 64, 8, Activation::kSiluGated, RoutingMethod::kDeepseekV3, 128, 64, false, 64,
     false, false},
    {"qwen2_gated_shared", 100, 16, 4, Activation::kSiluGated, RoutingMethod::kSoftmaxTopk, 128, 64, false, 192, true},
    {"relu2_all", 17, 8, 2, Activation::kRelu2, RoutingMethod::kSigmoidRenorm, 128, 80, true, 64, true},
};

MoeConfig config_of(const ExtrasCase& c) {
  MoeConfig cfg;
  cfg.num_experts = c.E;
  cfg.hidden = c.H;
  cfg.intermediate = c.I;
  cfg.max_num_tokens = c.M;
  cfg.activation.kind = c.act;
  cfg.routing.method = c.method;
  cfg.routing.top_k = c.k;
  if (c.method == RoutingMethod::kDeepseekV3) {
    cfg.routing.num_groups = 8;
    cfg.routing.topk_groups = 4;
    cfg.routing.routed_scaling_factor = 2.5f;
    cfg.routing.renormalize = c.renormalize;
  }
  cfg.has_expert_bias = c.bias;
  cfg.shared_intermediate = c.shared_I;
  cfg.has_shared_gate = c.shared_gate;
  return cfg;
}

class CudaExtras : public ::testing::TestWithParam<int> {};

TEST_P(CudaExtras, MonolithicEqualsModularAndMatchesReference) {
  MOEKIT_REQUIRE_SM90();
  const ExtrasCase& c = kCases[GetParam()];
  const MoeConfig cfg = config_of(c);
  std::mt19937_64 rng(testing::seed_from({GetParam(), c.M, c.E, c.k, 42}));
  const int64_t n1 = c.act == Activation::kRelu2 ? c.I : 2 * c.I;
  const int64_t n1s = c.act == Activation::kRelu2 ? c.shared_I : 2 * c.shared_I;
  moekit_ref::LayerExtras extras;
  std::vector<double> w13_d, w2_d, hidden_d, logits_d;
  HostTensor w13 = testing::random_tensor(rng, DType::kBF16, {c.E, n1, c.H}, 1.0 / std::sqrt(double(c.H)), &w13_d);
  HostTensor w2 = testing::random_tensor(rng, DType::kBF16, {c.E, c.H, c.I}, 1.0 / std::sqrt(double(c.I)), &w2_d);
  HostTensor b13, b2, sw13, sw2, sg;
  MoeWeights mw{w13.view(), w2.view(), {}};
  if (c.bias) {
    b13 = testing::random_tensor(rng, DType::kBF16, {c.E, n1}, 1.0, &extras.b13);
    b2 = testing::random_tensor(rng, DType::kF32, {c.E, c.H}, 1.0, &extras.b2);
    mw.w13_bias = b13.view();
    mw.w2_bias = b2.view();
  }
  if (c.shared_I > 0) {
    extras.shared_I = c.shared_I;
    sw13 = testing::random_tensor(rng, DType::kBF16, {n1s, c.H}, 1.0 / std::sqrt(double(c.H)), &extras.shared_w13);
    sw2 = testing::random_tensor(rng, DType::kBF16, {c.H, c.shared_I}, 1.0 / std::sqrt(double(c.shared_I)),
                                 &extras.shared_w2);
    mw.shared_w13 = sw13.view();
    mw.shared_w2 = sw2.view();
    if (c.shared_gate) {
      sg = testing::random_tensor(rng, DType::kBF16, {c.H}, 1.0 / std::sqrt(double(c.H)), &extras.shared_gate);
      mw.shared_gate = sg.view();
    }
  }
  HostTensor hidden = testing::random_tensor(rng, DType::kBF16, {c.M, c.H}, 1.0, &hidden_d);
  HostTensor logits = testing::tie_free_logits(rng, DType::kF32, c.M, c.E, 1.0 / 32.0, &logits_d);
  DeviceTensor hidden_dev(hidden), logits_dev(logits);

  std::vector<HostTensor> outs, captures;
  for (const char* cls : {"Sm90Monolithic", "Sm90Modular"}) {
    auto layer = MoeLayer::create_with(cfg, mw, cuda_test::sm90_kernel_class(cls), Platform::probe());
    ASSERT_TRUE(layer.ok()) << cls << ": " << layer.status().to_string();
    DeviceTensor out(DType::kBF16, {c.M, c.H}), cap(DType::kI16, {c.M, c.k});
    out.poison();
    LayerForwardArgs a;
    a.hidden = hidden_dev.view();
    a.router_logits = logits_dev.view();
    a.out = out.view();
    a.routing_replay_out = cap.view();
    const Status st = (*layer)->forward(a);
    ASSERT_TRUE(st.ok()) << cls << ": " << st.to_string();
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    outs.push_back(out.download());
    captures.push_back(cap.download());
  }
  EXPECT_EQ(cuda_test::first_difference(outs[0], outs[1]), "") << "monolithic and modular differ";

  const moekit_ref::RoutingResult rr = moekit_ref::route(testing::ref_routing(cfg.routing), logits_d, c.M, c.E);
  const std::vector<double> captured = testing::to_double(captures[0].view());
  for (int64_t i = 0; i < c.M * c.k; ++i) ASSERT_EQ(captured[i], rr.ids[i]) << "captured id " << i;
  const std::vector<double> ref =
      moekit_ref::moe_layer(testing::ref_layer(cfg), hidden_d, c.M, w13_d, w2_d, rr.ids, rr.weights, c.k, extras);
  EXPECT_LE(testing::rel_l2_error(testing::to_double(outs[0].view()), ref), kBound);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaExtras, ::testing::Range(0, int(std::size(kCases))),
                         [](const auto& info) { return std::string(kCases[info.param].name); });

// A shared intermediate the grouped GEMM cannot tile is refused by name.
TEST(CudaExtras, SupportsNamesSharedAlignment) {
  ExtrasCase c = kCases[2];
  c.shared_I = 100;
  const Support s = cuda_test::sm90_kernel_class("Sm90Modular").supports(config_of(c), Platform::probe());
  if (!Platform::probe().has_sm90()) GTEST_SKIP() << "needs an sm_90 CUDA device";
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("shared expert intermediate"), std::string::npos) << s.reason;
}

}  // namespace
}  // namespace moekit
