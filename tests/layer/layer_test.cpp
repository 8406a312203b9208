// The layer's public surface added with the Python package: route() on host
// tensors, selection restricted to a device type, a per-forward
// routing_replay_out next to a bound capture target, shared layers in a Model,
// weights updated in place.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>
#include <random>

#include "moekit/capture.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "moekit/routing.h"
#include "util/test_util.h"

namespace moekit {
namespace {

constexpr int64_t kE = 16, kH = 64, kI = 32, kM = 6;
constexpr int kK = 4;

MoeConfig config() {
  MoeConfig c;
  c.num_experts = kE;
  c.hidden = kH;
  c.intermediate = kI;
  c.max_num_tokens = 8;
  c.routing.method = RoutingMethod::kRenormalize;
  c.routing.top_k = kK;
  c.needs_capture = true;
  return c;
}

struct Inputs {
  HostTensor w13, w2, hidden, logits;
  explicit Inputs(uint64_t seed) {
    std::mt19937_64 rng(seed);
    w13 = testing::random_tensor(rng, DType::kBF16, {kE, 2 * kI, kH}, 0.1);
    w2 = testing::random_tensor(rng, DType::kBF16, {kE, kH, kI}, 0.1);
    hidden = testing::random_tensor(rng, DType::kBF16, {kM, kH}, 1.0);
    logits = testing::tie_free_logits(rng, DType::kF32, kM, kE, 0.03);
  }
  MoeWeights weights() const { return {w13.view(), w2.view(), {}}; }
};

TEST(Route, HostTensorsGoToTheCpuRouter) {
  Inputs in(testing::seed_from({1}));
  HostTensor ids(DType::kI32, {kM, kK}), w(DType::kF32, {kM, kK}), ids_cpu(DType::kI32, {kM, kK}),
      w_cpu(DType::kF32, {kM, kK});
  RoutingArgs a{in.logits.view(), {}, {}, ids.view(), w.view(), {}, {}};
  ASSERT_TRUE(route(config().routing, a).ok());
  RoutingArgs b{in.logits.view(), {}, {}, ids_cpu.view(), w_cpu.view(), {}, {}};
  ASSERT_TRUE(route_cpu(config().routing, b).ok());
  EXPECT_EQ(std::memcmp(ids.data<void>(), ids_cpu.data<void>(), ids.nbytes()), 0);
  EXPECT_EQ(std::memcmp(w.data<void>(), w_cpu.data<void>(), w.nbytes()), 0);
}

TEST(Route, MissingLogitsIsAnError) {
  HostTensor ids(DType::kI32, {kM, kK}), w(DType::kF32, {kM, kK});
  RoutingArgs a;
  a.topk_ids = ids.view();
  a.topk_weights = w.view();
  const Status s = route(config().routing, a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("logits"), std::string::npos) << s.message();
}

TEST(SelectBackendOn, KeepsToTheDeviceType) {
  auto cpu = select_backend_on(config(), Platform::cpu_only(), DeviceType::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  EXPECT_EQ(cpu->backend, "cpu");
  auto cuda = select_backend_on(config(), Platform::cpu_only(), DeviceType::kCuda);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(cuda.status().message().find("no backend of this build runs on a CUDA device"), std::string::npos);
}

TEST(MoeLayerOnDevice, ACudaLayerNeverFallsBackToTheCpu) {
  Inputs in(testing::seed_from({2}));
  auto layer = MoeLayer::create(config(), in.weights(), Device::cuda(0), Platform::cpu_only());
  ASSERT_FALSE(layer.ok());
  EXPECT_EQ(layer.status().code(), StatusCode::kUnsupported);
  auto cpu = MoeLayer::create(config(), in.weights(), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  EXPECT_EQ((*cpu)->device(), Device::cpu());
}

TEST(MoeLayerIdsOut, PerForwardTargetAndBoundCaptureTargetGetTheSameRows) {
  Inputs in(testing::seed_from({3}));
  auto created = MoeLayer::create(config(), in.weights(), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  std::shared_ptr<MoeLayer> layer = std::move(created).value();
  Model model;
  ASSERT_TRUE(model.add_layer(layer, 0).ok());
  auto capturer = RoutedExpertsCapturer::create(1, 8, kK);
  ASSERT_TRUE(capturer.ok());
  ASSERT_TRUE(bind(model, **capturer).ok());
  ASSERT_TRUE((*capturer)->add_request("r").ok());
  ASSERT_TRUE((*capturer)->begin_step({{{"r", kM}}}).ok());

  HostTensor out(DType::kBF16, {kM, kH}), ids(DType::kI16, {kM, kK});
  testing::poison(ids);
  LayerForwardArgs a;
  a.hidden = in.hidden.view();
  a.router_logits = in.logits.view();
  a.out = out.view();
  a.routing_replay_out = ids.view();
  ASSERT_TRUE(layer->forward(a).ok());
  ASSERT_TRUE((*capturer)->end_step().ok());  // fails if a captured row was left unwritten
  auto captured = (*capturer)->routed_experts("r");
  ASSERT_TRUE(captured.ok());
  ASSERT_EQ(captured->nbytes(), ids.nbytes());
  EXPECT_EQ(std::memcmp(captured->data<void>(), ids.data<void>(), ids.nbytes()), 0);
  // A layer handle kept by the caller is the layer in the model.
  EXPECT_EQ(model.moe_layer(0), layer.get());
}

// The layer's report: the oracle's walk, what it resolved, and the GEMM plan.
TEST(MoeLayerReport, NamesEveryCandidateTheChoiceAndTheGemmPlan) {
  Inputs in(testing::seed_from({7}));
  auto layer = MoeLayer::create(config(), in.weights(), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  const std::string r = (*layer)->report_string();
  for (const std::string& part : {std::string("CpuMonolithic"), std::string("CpuModular"),
                                  "resolved: cpu / " + std::string((*layer)->kernel().name()),
                                  "gemm plan (" + std::string((*layer)->kernel().name()) + "):", std::string("  M=1"),
                                  std::string("workspace: "), std::string("for max_num_tokens = 8")}) {
    EXPECT_NE(r.find(part), std::string::npos) << "missing '" << part << "' in:\n" << r;
  }
}

TEST(MoeLayerIdsOut, TooFewRowsIsRejected) {
  Inputs in(testing::seed_from({4}));
  auto layer = MoeLayer::create(config(), in.weights(), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(layer.ok());
  HostTensor out(DType::kBF16, {kM, kH}), ids(DType::kI16, {kM - 1, kK});
  LayerForwardArgs a;
  a.hidden = in.hidden.view();
  a.router_logits = in.logits.view();
  a.out = out.view();
  a.routing_replay_out = ids.view();
  const Status s = (*layer)->forward(a);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("routing_replay_out: needs at least M"), std::string::npos) << s.message();
}

// Custom routing: the caller's ids are counted and captured by the layer's
// routing stage, as the router's are (before, a modular layer left
// expert_counts unwritten for them).
TEST(MoeLayerCustomRouting, CountsAndCapturesTheCallersIds) {
  Inputs in(testing::seed_from({5}));
  MoeConfig c = config();
  c.routing.method = RoutingMethod::kCustom;
  auto layer = MoeLayer::create(c, in.weights(), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  std::mt19937_64 rng(testing::seed_from({6}));
  std::vector<int32_t> expected;
  const HostTensor ids = testing::random_distinct_ids(rng, kM, kE, kK, &expected);
  HostTensor weights(DType::kF32, {kM, kK});
  std::fill_n(weights.data<float>(), kM * kK, 0.25f);
  HostTensor out(DType::kBF16, {kM, kH}), counts(DType::kI32, {kE}), captured(DType::kI16, {8, kK}),
      captured_weights(DType::kF32, {8, kK});
  testing::poison(counts);
  testing::poison(captured);
  ASSERT_TRUE((*layer)->set_capture_target(captured.view(), captured_weights.view()).ok());
  LayerForwardArgs a;
  a.hidden = in.hidden.view();
  a.topk_ids = ids.view();
  a.topk_weights = weights.view();
  a.out = out.view();
  a.expert_counts = counts.view();
  ASSERT_TRUE((*layer)->forward(a).ok());
  for (int64_t e = 0; e < kE; ++e) EXPECT_EQ(counts.data<int32_t>()[e], expected[e]) << "expert " << e;
  for (int64_t i = 0; i < kM * kK; ++i) {
    EXPECT_EQ(captured.data<int16_t>()[i], ids.data<int32_t>()[i]) << i;
    EXPECT_EQ(captured_weights.data<float>()[i], 0.25f) << i;
  }
}

TEST(MoeConfigValidate, ChecksNumExpertsBeforeNarrowingIt) {
  MoeConfig c = config();
  c.num_experts = (int64_t{1} << 32) + kE;  // narrowed to int, this would read as 16
  Status st = c.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("got 4294967312"), std::string::npos) << st.message();
  c.num_experts = int64_t{1} << 40;  // narrowed, 0
  st = c.validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("<= 32767"), std::string::npos) << st.message();
}

TEST(MoeLayerCreate, BuffersThatCannotBeAllocatedAreResourceExhausted) {
  Inputs in(testing::seed_from({6}));
  // 2^40 tokens: sizes fit int64 but no host can allocate them (fails at once, nothing touched).
  // 2^58 tokens: the byte counts themselves overflow; never a small wrapped buffer.
  for (const int64_t tokens : {int64_t{1} << 40, int64_t{1} << 58, INT64_MAX}) {
    MoeConfig c = config();
    c.max_num_tokens = tokens;
    auto layer = MoeLayer::create(c, in.weights(), Device::cpu(), Platform::cpu_only());
    ASSERT_FALSE(layer.ok()) << tokens;
    EXPECT_EQ(layer.status().code(), StatusCode::kResourceExhausted) << tokens << ": " << layer.status().to_string();
  }
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

std::shared_ptr<MoeLayer> cpu_layer(const MoeConfig& c, const Inputs& in) {
  auto made = MoeLayer::create(c, in.weights(), Device::cpu(), Platform::cpu_only());
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::shared_ptr<MoeLayer>(std::move(made).value()) : nullptr;
}

HostTensor run(MoeLayer& layer, const Inputs& in) {
  HostTensor out(DType::kBF16, {kM, kH});
  LayerForwardArgs a;
  a.hidden = in.hidden.view();
  a.router_logits = in.logits.view();
  a.out = out.view();
  EXPECT_TRUE(layer.forward(a).ok());
  return out;
}

// update_weights: a layer updated to new weights computes what a layer made
// with them computes, bit for bit (deepseek_v3, so its selection bias too);
// bad weights are refused by name, and the layer then refuses to run, saying
// why, until an update succeeds.
TEST(MoeLayerUpdateWeights, EqualsALayerMadeWithTheNewWeights) {
  MoeConfig c = config();
  c.routing.method = RoutingMethod::kDeepseekV3;
  c.routing.num_groups = 4;
  c.routing.topk_groups = 2;
  c.routing.has_score_bias = true;
  const Inputs a(testing::seed_from({31, 1})), b(testing::seed_from({31, 2}));
  std::mt19937_64 rng(testing::seed_from({31, 3}));
  const HostTensor bias_a = testing::random_tensor(rng, DType::kF32, {kE}, 0.5);
  const HostTensor bias_b = testing::random_tensor(rng, DType::kF32, {kE}, 0.5);
  const auto weights = [](const Inputs& in, const HostTensor& bias) {
    MoeWeights w = in.weights();
    w.score_bias = bias.view();
    return w;
  };
  const auto forward = [&](MoeLayer& layer, const Inputs& in, HostTensor* out) {
    LayerForwardArgs f;
    f.hidden = in.hidden.view();
    f.router_logits = in.logits.view();
    f.out = out->view();
    return layer.forward(f);
  };
  auto layer = MoeLayer::create(c, weights(a, bias_a), Device::cpu(), Platform::cpu_only());
  auto made_b = MoeLayer::create(c, weights(b, bias_b), Device::cpu(), Platform::cpu_only());
  ASSERT_TRUE(layer.ok() && made_b.ok());
  HostTensor out_a(DType::kBF16, {kM, kH}), out_b(DType::kBF16, {kM, kH}), out(DType::kBF16, {kM, kH});
  ASSERT_TRUE(forward(**layer, a, &out_a).ok());
  ASSERT_TRUE(forward(**made_b, a, &out_b).ok());  // b's weights on a's tokens
  ASSERT_NE(std::memcmp(out_a.data<void>(), out_b.data<void>(), out.nbytes()), 0);

  ASSERT_TRUE((*layer)->update_weights(weights(b, bias_b)).ok());
  ASSERT_TRUE(forward(**layer, a, &out).ok());
  EXPECT_EQ(std::memcmp(out.data<void>(), out_b.data<void>(), out.nbytes()), 0) << "updated layer != layer made with b";

  HostTensor nan_w2 = b.w2;
  nan_w2.data<uint16_t>()[7] = 0x7fc0;  // a bf16 NaN
  MoeWeights bad = weights(b, bias_b);
  bad.w2 = nan_w2.view();
  const Status refused = (*layer)->update_weights(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("w2"), std::string::npos) << refused.message();
  const Status stopped = forward(**layer, a, &out);
  EXPECT_EQ(stopped.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(stopped.message().find("last update_weights failed"), std::string::npos) << stopped.message();

  ASSERT_TRUE((*layer)->update_weights(weights(a, bias_a)).ok());
  ASSERT_TRUE(forward(**layer, a, &out).ok());
  EXPECT_EQ(std::memcmp(out.data<void>(), out_a.data<void>(), out.nbytes()), 0) << "back to a";
}

// 48 layers of a model hold one layer's workspace, not 48, and compute what
// layers with workspaces of their own compute, bit for bit, in any order.
TEST(ModelWorkspace, LayersShareOneAndComputeAlike) {
  const int kLayers = 48;
  std::vector<Inputs> inputs;
  for (int l = 0; l < kLayers; ++l) inputs.emplace_back(testing::seed_from({5, l}));
  Model shared, own(/*share_workspace=*/false);
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(shared.add_layer(cpu_layer(config(), inputs[l]), l).ok());
    ASSERT_TRUE(own.add_layer(cpu_layer(config(), inputs[l]), l).ok());
  }
  const size_t one = shared.moe_layer(0)->workspace_bytes();
  ASSERT_GT(one, 0u);
  EXPECT_EQ(shared.workspace_bytes(), one);
  EXPECT_EQ(own.workspace_bytes(), kLayers * one);
  for (int l = kLayers - 1; l >= 0; --l) {  // reverse order: each layer overwrites what the last left
    const HostTensor a = run(*shared.moe_layer(l), inputs[l]);
    const HostTensor b = run(*own.moe_layer(l), inputs[l]);
    ASSERT_EQ(std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()), 0) << "layer " << l;
  }
}

// A larger layer grows the model's buffer while no layer on it has run; once
// one has (a captured graph may hold the address), a larger one keeps its own,
// as does a layer that ran before it was added.
TEST(ModelWorkspace, GrowsOnlyBeforeAnyLayerRan) {
  Inputs in(testing::seed_from({6}));
  MoeConfig small = config(), large = config();
  large.max_num_tokens = 64;
  Model m;
  ASSERT_TRUE(m.add_layer(cpu_layer(small, in), 0).ok());
  ASSERT_TRUE(m.add_layer(cpu_layer(large, in), 1).ok());
  const size_t big = m.moe_layer(1)->workspace_bytes();
  ASSERT_GT(big, m.moe_layer(0)->workspace_bytes());
  EXPECT_EQ(m.workspace_bytes(), big);
  EXPECT_EQ(m.moe_layer(0)->workspace_buffer(), m.moe_layer(1)->workspace_buffer());
  const void* address = m.moe_layer(0)->workspace_buffer()->data();
  run(*m.moe_layer(0), in);
  MoeConfig larger = config();
  larger.max_num_tokens = 512;
  ASSERT_TRUE(m.add_layer(cpu_layer(larger, in), 2).ok());
  EXPECT_EQ(m.moe_layer(0)->workspace_buffer()->data(), address);  // unmoved under the layer that ran
  EXPECT_NE(m.moe_layer(2)->workspace_buffer(), m.moe_layer(0)->workspace_buffer());
  EXPECT_EQ(m.workspace_bytes(), big + m.moe_layer(2)->workspace_bytes());
  std::shared_ptr<MoeLayer> ran = cpu_layer(small, in);
  run(*ran, in);
  const std::shared_ptr<DeviceBuffer> its_own = ran->workspace_buffer();
  ASSERT_TRUE(m.add_layer(ran, 3).ok());
  EXPECT_EQ(ran->workspace_buffer(), its_own);
  const Status s = ran->use_workspace(m.moe_layer(0)->workspace_buffer());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("has run already"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moekit
