// Replay: a capture replayed through the file reproduces the outputs bit for
// bit for every routing method on both CPU kernels; forced ids on other logits
// give the reference layer for those ids; bad forced ids are rejected before
// anything runs (outputs stay poisoned).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "capture/capture_test_util.h"
#include "reference/reference.h"
#include "util/reference_params.h"

namespace moekit {
namespace {

using testing::kBuiltInMethods;
using testing::LayerStep;
using testing::make_model;
using testing::make_step_inputs;
using testing::ModelShape;
using testing::replay_shape;
using testing::run_layers;
using testing::two_request_schedule;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "moekit_replay_" + std::to_string(::getpid()) + "_" + name;
}

using ReplayParam = std::tuple<RoutingMethod, std::string>;

class ReplayBitExact : public ::testing::TestWithParam<ReplayParam> {};

TEST_P(ReplayBitExact, ReplayingTheCaptureFileReproducesTheOutputs) {
  const auto& [method, kernel] = GetParam();
  const ModelShape s = replay_shape(method);
  const uint64_t seed = testing::seed_from({31, static_cast<int64_t>(method), kernel == "CpuModular"});
  auto model = make_model(s, kernel, seed);
  ASSERT_TRUE(model);
  ASSERT_EQ(model->moe_layer(0)->kernel().name(), kernel);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k));
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("p").ok());
  ASSERT_TRUE((*cap)->add_request("q").ok());

  // Record. Logits are plain Gaussian here (ties allowed): replay must be exact anyway.
  std::vector<std::vector<LayerStep>> recorded;
  for (size_t i = 0; i < two_request_schedule().size(); ++i) {
    const StepLayout& layout = two_request_schedule()[i];
    auto in = make_step_inputs(s, layout.num_rows(), seed + i);
    ASSERT_TRUE((*cap)->begin_step(layout).ok());
    ASSERT_TRUE(run_layers(*model, in).ok());
    ASSERT_TRUE((*cap)->end_step().ok());
    recorded.push_back(std::move(in));
  }
  auto snap = (*cap)->snapshot();
  ASSERT_TRUE(snap.ok());
  const std::string path = temp_path(std::string(routing_method_name(method)) + "_" + kernel + ".safetensors");
  ASSERT_TRUE(write_capture_file(path, *snap).ok());

  // Replay from the file, on fresh (poisoned) outputs, capturing again.
  auto file = read_capture_file(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto replayer = RoutedExpertsReplayer::create(*file, *model);
  ASSERT_TRUE(replayer.ok()) << replayer.status().to_string();
  auto cap2 = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k));
  ASSERT_TRUE(bind(*model, **cap2).ok());
  ASSERT_TRUE((*cap2)->add_request("p").ok());
  ASSERT_TRUE((*cap2)->add_request("q").ok());
  for (size_t i = 0; i < two_request_schedule().size(); ++i) {
    std::vector<LayerStep> again = make_step_inputs(s, two_request_schedule()[i].num_rows(), seed + i);
    ASSERT_TRUE((*replayer)->begin_step(two_request_schedule()[i]).ok());
    ASSERT_TRUE((*cap2)->begin_step(two_request_schedule()[i]).ok());
    ASSERT_TRUE(run_layers(*model, again, replayer->get()).ok());
    ASSERT_TRUE((*cap2)->end_step().ok());
    for (int l = 0; l < s.num_layers; ++l) {
      const HostTensor& a = recorded[i][l].out;
      const HostTensor& b = again[l].out;
      ASSERT_EQ(0, std::memcmp(a.data<uint8_t>(), b.data<uint8_t>(), a.nbytes()))
          << "step " << i << " layer " << l << ": replay differs from the recorded output";
    }
  }
  // The replayed ids are the captured ones.
  for (const char* req : {"p", "q"}) {
    auto a = (*cap)->routed_experts(req);
    auto b = (*cap2)->routed_experts(req);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->shape(), b->shape());
    EXPECT_EQ(0, std::memcmp(a->data<int16_t>(), b->data<int16_t>(), a->nbytes())) << req;
  }
}

std::string replay_name(const ::testing::TestParamInfo<ReplayParam>& info) {
  return std::string(routing_method_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(EveryMethodBothKernels, ReplayBitExact,
                         ::testing::Combine(::testing::ValuesIn(kBuiltInMethods),
                                            ::testing::Values("CpuMonolithic", "CpuModular")),
                         replay_name);

// Forced ids on logits that would route elsewhere: the ids win, and the output
// is the fp64 reference layer for those ids with the weights the routing method
// gives them from the live logits.
class ReplayForces : public ::testing::TestWithParam<ReplayParam> {};

TEST_P(ReplayForces, ForcedIdsGiveTheReferenceLayerForThoseIds) {
  const auto& [method, kernel] = GetParam();
  ModelShape s = replay_shape(method);
  s.act = DType::kF32;
  s.num_layers = 1;
  const uint64_t seed = testing::seed_from({32, static_cast<int64_t>(method), kernel == "CpuModular"});
  std::vector<testing::LayerWeights> w;
  auto model = make_model(s, kernel, seed, &w);
  ASSERT_TRUE(model);
  const int64_t m = 9;
  auto in = make_step_inputs(s, m, seed + 1);
  // Forced ids: distinct experts per row, a rotation that differs from routing.
  HostTensor forced(DType::kI32, {m, s.k});
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < s.k; ++j) forced.data<int32_t>()[t * s.k + j] = static_cast<int32_t>((3 * t + 5 * j + 1) % s.E);
  }
  auto cap = RoutedExpertsCapturer::create(1, s.max_tokens, static_cast<int>(s.k));
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("r").ok());
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"r", m}}}).ok());
  LayerForwardArgs a{in[0].hidden.view(), in[0].logits.view(), in[0].out.view(), forced.view()};
  ASSERT_TRUE(model->layer(0).forward(a).ok());
  ASSERT_TRUE((*cap)->end_step().ok());
  auto got = (*cap)->routed_experts("r");
  ASSERT_TRUE(got.ok());
  for (int64_t i = 0; i < m * s.k; ++i) ASSERT_EQ(got->data<int16_t>()[i], forced.data<int32_t>()[i]) << i;

  const MoeConfig cfg = testing::config_for(s);
  std::vector<int32_t> forced_v(forced.data<int32_t>(), forced.data<int32_t>() + m * s.k);
  const auto ref_route =
      moekit_ref::route(testing::ref_routing(cfg.routing, w[0].biasd), in[0].logits_d, m, s.E, forced_v);
  ASSERT_EQ(ref_route.ids, forced_v);
  const std::vector<double> ref =
      moekit_ref::moe_layer(testing::ref_layer(cfg), testing::to_double(in[0].hidden.view()), m, w[0].w13d, w[0].w2d,
                            forced_v, ref_route.weights, static_cast<int>(s.k));
  // f32 throughout on exactly the values the reference sees: the error is fp32
  // rounding in dot products of length H = 64 and I = 32 plus the routing
  // weights (softmax/sigmoid in fp32), worst case ~K * 2^-24 ~ 4e-6; 1e-5 is
  // that bound with room for the weight computation.
  const double err = testing::rel_l2_error(testing::to_double(in[0].out.view()), ref);
  EXPECT_LT(err, 1e-5) << routing_method_name(method) << " " << kernel;
}

INSTANTIATE_TEST_SUITE_P(EveryMethodBothKernels, ReplayForces,
                         ::testing::Combine(::testing::ValuesIn(kBuiltInMethods),
                                            ::testing::Values("CpuMonolithic", "CpuModular")),
                         replay_name);

// ---------------------------------------------------------------- bad forced ids

class BadForcedIds : public ::testing::TestWithParam<std::string> {};

TEST_P(BadForcedIds, AreRejectedBeforeAnythingRuns) {
  ModelShape s;
  s.num_layers = 1;
  auto model = make_model(s, GetParam(), 41);
  ASSERT_TRUE(model);
  const int64_t m = 5;
  struct Case {
    const char* name;
    DType dtype;
    int64_t rows, cols;
    int64_t at;   // element to spoil, -1 none
    int32_t value;
    const char* want;
  } cases[] = {
      {"out of range", DType::kI32, m, s.k, 7, static_cast<int32_t>(s.E), "forced_ids[1, 3] = 16 is not an expert id"},
      {"negative", DType::kI32, m, s.k, 2, -5, "forced_ids[0, 2] = -5"},
      {"sentinel", DType::kI32, m, s.k, 0, -1, "-1"},
      {"duplicate", DType::kI32, m, s.k, 1, -2, "duplicates forced_ids[0, 0]"},  // -2: copy slot 0 into slot 1
      {"wrong shape", DType::kI32, m, s.k + 1, -1, 0, "forced_ids: expected shape"},
      {"wrong rows", DType::kI32, m - 1, s.k, -1, 0, "forced_ids: expected shape"},
      {"wrong dtype", DType::kI16, m, s.k, -1, 0, "forced_ids: expected dtype i32"},
  };
  for (const Case& c : cases) {
    auto in = make_step_inputs(s, m, 42);
    HostTensor ids(c.dtype, {c.rows, c.cols});
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t j = 0; j < c.cols; ++j) {
        const int64_t v = (r + 2 * j) % s.E;
        if (c.dtype == DType::kI32) ids.data<int32_t>()[r * c.cols + j] = static_cast<int32_t>(v);
        else ids.data<int16_t>()[r * c.cols + j] = static_cast<int16_t>(v);
      }
    }
    if (c.at >= 0) ids.data<int32_t>()[c.at] = c.value == -2 ? ids.data<int32_t>()[c.at - 1] : c.value;
    const HostTensor before = in[0].out;  // poisoned
    LayerForwardArgs a{in[0].hidden.view(), in[0].logits.view(), in[0].out.view(), ids.view()};
    Status st = model->layer(0).forward(a);
    ASSERT_FALSE(st.ok()) << c.name;
    EXPECT_NE(st.message().find(c.want), std::string::npos) << c.name << ": " << st.message();
    EXPECT_EQ(0, std::memcmp(before.data<uint8_t>(), in[0].out.data<uint8_t>(), before.nbytes()))
        << c.name << ": the output was written";
  }
}

INSTANTIATE_TEST_SUITE_P(CpuKernels, BadForcedIds, ::testing::Values("CpuMonolithic", "CpuModular"));

// ---------------------------------------------------------------- the replayer's checks

CaptureSet capture_of(const Model& model, int64_t tokens, int64_t E, int k) {
  CaptureSet set;
  set.info.num_experts = E;
  set.info.routing = model.layer(0).config().routing;
  set.info.model_layers = model.model_layer_indices();
  RequestCapture r;
  r.request = "r";
  r.ids = HostTensor(DType::kI16, {tokens, model.num_layers(), k});
  for (int64_t i = 0; i < r.ids.numel(); ++i) r.ids.data<int16_t>()[i] = static_cast<int16_t>(i % k);
  set.requests.push_back(std::move(r));
  return set;
}

TEST(Replayer, RejectsCapturesThatDoNotFitTheModel) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 43);
  ASSERT_TRUE(model);
  const int k = static_cast<int>(s.k);
  {
    CaptureSet c = capture_of(*model, 4, s.E, k);
    c.requests[0].ids.data<int16_t>()[5] = static_cast<int16_t>(s.E);
    auto r = RoutedExpertsReplayer::create(c, *model);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("outside [0, 16)"), std::string::npos) << r.status().message();
  }
  {
    CaptureSet c = capture_of(*model, 4, s.E, k);
    c.requests[0].ids.data<int16_t>()[6] = kUnwrittenExpertId;
    EXPECT_NE(RoutedExpertsReplayer::create(c, *model).status().message().find("sentinel"), std::string::npos);
  }
  {
    CaptureSet c = capture_of(*model, 4, s.E, k);
    c.requests[0].ids.data<int16_t>()[1] = c.requests[0].ids.data<int16_t>()[0];
    EXPECT_NE(RoutedExpertsReplayer::create(c, *model).status().message().find("repeats"), std::string::npos);
  }
  {
    CaptureSet c = capture_of(*model, 4, s.E, k);
    c.info.model_layers = {0, 1};
    EXPECT_NE(RoutedExpertsReplayer::create(c, *model).status().message().find("model layer"), std::string::npos);
  }
  {
    CaptureSet c = capture_of(*model, 4, s.E, k);
    c.info.routing.method = RoutingMethod::kSigmoid;
    EXPECT_NE(RoutedExpertsReplayer::create(c, *model).status().message().find("made with sigmoid"),
              std::string::npos);
  }
}

TEST(Replayer, AStepBeyondTheCaptureFailsAndChangesNothing) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 44);
  ASSERT_TRUE(model);
  CaptureSet c = capture_of(*model, 4, s.E, static_cast<int>(s.k));
  c.requests[0].first_token = 2;  // tokens [2, 6) were captured
  auto rp = RoutedExpertsReplayer::create(c, *model);
  ASSERT_TRUE(rp.ok());
  ASSERT_TRUE((*rp)->begin_step(StepLayout{{{"r", 3}}}).ok());
  Status st = (*rp)->begin_step(StepLayout{{{"r", 2}}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("needs tokens [5, 7), the capture holds [2, 6)"), std::string::npos) << st.message();
  ASSERT_TRUE((*rp)->begin_step(StepLayout{{{"r", 1}}}).ok());  // the cursor did not move
  EXPECT_EQ((*rp)->forced_ids(0).ptr<int32_t>()[0], c.requests[0].ids.data<int16_t>()[3 * s.num_layers * s.k]);
  EXPECT_FALSE((*rp)->begin_step(StepLayout{{{"nobody", 1}}}).ok());
  EXPECT_FALSE((*rp)->start_token("r", 1).ok());  // before first_token
  EXPECT_TRUE((*rp)->start_token("r", 2).ok());
}

TEST(Replayer, SaysWhetherAStepWasBegunAndHowManyRowsItHas) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 45);
  ASSERT_TRUE(model);
  CaptureSet c = capture_of(*model, 4, s.E, static_cast<int>(s.k));
  auto rp = RoutedExpertsReplayer::create(c, *model);
  ASSERT_TRUE(rp.ok());
  EXPECT_FALSE((*rp)->has_step());  // before the first step: nothing to force
  EXPECT_FALSE((*rp)->forced_ids(0).defined());
  ASSERT_TRUE((*rp)->begin_step(StepLayout{}).ok());  // a step of no rows
  EXPECT_TRUE((*rp)->has_step());
  EXPECT_EQ((*rp)->step_rows(), 0);
  EXPECT_FALSE((*rp)->forced_ids(0).defined());
  ASSERT_TRUE((*rp)->begin_step(StepLayout{{{"r", 2}}}).ok());
  EXPECT_EQ((*rp)->step_rows(), 2);
  EXPECT_EQ((*rp)->forced_ids(0).dim(0), 2);
}

}  // namespace
}  // namespace moekit
