// RoutedExpertsCapturer and bind(): no allocation when disabled, the sentinel
// that exposes unwritten rows, bind errors (nothing half-bound), and the
// per-request accounting of a multi-step, multi-request run checked against an
// expectation built independently from the fp64 reference router.
#include <gtest/gtest.h>

#include <cstdio>
#include <unistd.h>

#include <cstring>
#include <map>

#include "capture/capture_test_util.h"
#include "reference/reference.h"

namespace moekit {
namespace {

using testing::LayerStep;
using testing::make_model;
using testing::make_step_inputs;
using testing::ModelShape;
using testing::run_layers;

// ---------------------------------------------------------------- spy kernels

// What the spy kernels saw in their last run().
struct SpyLog {
  int runs = 0;
  bool saw_capture_target = false;
};
SpyLog g_spy;

// A monolithic kernel for bind/sentinel tests: writes zeros to `out`, and into
// routing_replay_out writes expert (row % E) in slot 0.., except that it skips
// the last row when kSkipLastRow (a kernel bug the sentinel must expose).
template <bool kCaptureCapable, bool kSkipLastRow>
class SpyMonolithic : public MoeKernel {
 public:
  explicit SpyMonolithic(MoeConfig c) : MoeKernel(std::move(c)) {}
  const char* name() const override { return kCaptureCapable ? "SpyCapable" : "SpyNoReplayOut"; }
  bool is_monolithic() const override { return true; }
  std::string gemm_plan(int64_t) const override { return "none (a spy)"; }
  bool supports_routing_replay_capture() const override { return kCaptureCapable; }
  Device device() const override { return Device::cpu(); }
  StatusOr<ProblemSize> problem_size(const TensorView&, const TensorView&, const TensorView&,
                                     const TensorView&) const override {
    return ProblemSize{};
  }
  size_t workspace_size(int64_t) const override { return 0; }
  Status prepare_weights(const MoeWeights&) override { return Status::Ok(); }
  Status run(const MoeRunArgs& args, Workspace, Stream) override {
    ++g_spy.runs;
    g_spy.saw_capture_target = args.routing_replay_out.defined();
    std::memset(args.out.data, 0, args.out.nbytes());
    if (args.routing_replay_out.defined()) {
      const int64_t m = args.hidden.dim(0), k = config_.top_k();
      int16_t* ids = args.routing_replay_out.ptr<int16_t>();
      for (int64_t r = 0; r < (kSkipLastRow ? m - 1 : m); ++r) {
        for (int64_t j = 0; j < k; ++j) ids[r * k + j] = static_cast<int16_t>((r + j) % config_.num_experts);
      }
    }
    return Status::Ok();
  }
};

template <typename K>
KernelClass spy_class() {
  return KernelClass{"Spy", true, [](const MoeConfig&, const Platform&) { return Support::yes(); },
                     [](const MoeConfig& c, const Platform&) -> StatusOr<std::unique_ptr<MoeKernel>> {
                       return std::unique_ptr<MoeKernel>(std::make_unique<K>(c));
                     }};
}

// A model whose layers all use kernel class `kc` (weights are never read).
std::unique_ptr<Model> spy_model(const KernelClass& kc, int layers, const ModelShape& s) {
  static HostTensor w13(DType::kBF16, {s.E, 2 * s.I, s.H}), w2(DType::kBF16, {s.E, s.H, s.I});
  auto model = std::make_unique<Model>();
  for (int l = 0; l < layers; ++l) {
    auto layer = MoeLayer::create_with(testing::config_for(s), {w13.view(), w2.view(), {}}, kc, Platform::cpu_only());
    EXPECT_TRUE(layer.ok()) << layer.status().to_string();
    EXPECT_TRUE(model->add_layer(std::move(layer).value(), l).ok());
  }
  return model;
}

// ---------------------------------------------------------------- allocation

TEST(Layer, ParallelConfigsAreSelectedButNotRunLocally) {
  // The oracle picks CpuModular for an all-to-all configuration, but a layer
  // refuses to run it rather than compute every expert on one rank (that is
  // ExpertParallelLayer's job).
  ModelShape s;
  MoeConfig cfg = testing::config_for(s);
  cfg.parallel.dp_size = cfg.parallel.ep_size = 2;
  cfg.parallel.all2all = All2AllBackend::kNccl;
  auto chosen = select_backend(cfg, Platform::cpu_only());
  ASSERT_TRUE(chosen.ok()) << chosen.status().to_string();
  EXPECT_EQ(chosen->kernel.name, "CpuModular");
  std::mt19937_64 rng(testing::seed_from({91}));
  HostTensor w13 = testing::random_tensor(rng, s.act, {s.E, 2 * s.I, s.H}, 0.1);
  HostTensor w2 = testing::random_tensor(rng, s.act, {s.E, s.H, s.I}, 0.1);
  auto layer = MoeLayer::create(cfg, MoeWeights{w13.view(), w2.view(), {}}, Platform::cpu_only());
  ASSERT_FALSE(layer.ok());
  EXPECT_EQ(layer.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(layer.status().message().find("runs through ExpertParallelLayer"), std::string::npos)
      << layer.status().to_string();
}

TEST(Capturer, DisabledAllocatesNothingAndLayersGetNoTarget) {
  ModelShape s;
  auto model = make_model(s, "CpuMonolithic", 1);
  ASSERT_TRUE(model);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, s.k, Device::cpu(), /*enabled=*/false);
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ((*cap)->allocated_bytes(), 0u);
  EXPECT_EQ((*cap)->buffer_data(), nullptr);
  EXPECT_FALSE((*cap)->layer_target(0).defined());
  ASSERT_TRUE(bind(*model, **cap).ok());
  for (int l = 0; l < model->num_layers(); ++l) EXPECT_FALSE(model->layer(l).capture_target().defined());
  // Steps are no-ops and still allocate nothing; asking for ids says capture is off.
  StepLayout layout{{{"a", 3}}};
  EXPECT_TRUE((*cap)->add_request("a").ok());
  EXPECT_TRUE((*cap)->begin_step(layout).ok());
  auto in = make_step_inputs(s, 3, 7);
  ASSERT_TRUE(run_layers(*model, in).ok());
  EXPECT_TRUE((*cap)->end_step().ok());
  EXPECT_EQ((*cap)->allocated_bytes(), 0u);
  auto ids = (*cap)->routed_experts("a");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("disabled"), std::string::npos);
}

TEST(Capturer, DisabledCaptureNeverReachesTheKernel) {
  ModelShape s;
  auto model = spy_model(spy_class<SpyMonolithic<true, false>>(), 2, s);
  auto cap = RoutedExpertsCapturer::create(2, s.max_tokens, s.k, Device::cpu(), /*enabled=*/false);
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(*model, **cap).ok());
  auto in = make_step_inputs(s, 4, 8);
  g_spy = {};
  ASSERT_TRUE(run_layers(*model, in).ok());
  EXPECT_EQ(g_spy.runs, 2);
  EXPECT_FALSE(g_spy.saw_capture_target);
}

TEST(Capturer, ABufferThatCannotExistIsResourceExhausted) {
  // 2^40 rows fit int64 but no host; 2^61 rows overflow the byte count (it wrapped to 0 before).
  for (const int64_t rows : {int64_t{1} << 40, int64_t{1} << 61}) {
    auto cap = RoutedExpertsCapturer::create(2, rows, 4);
    ASSERT_FALSE(cap.ok()) << rows;
    EXPECT_EQ(cap.status().code(), StatusCode::kResourceExhausted) << rows << ": " << cap.status().to_string();
  }
}

TEST(Capturer, EnabledAllocatesTheBufferOnceAtCreate) {
  auto cap = RoutedExpertsCapturer::create(3, 40, 8);
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ((*cap)->allocated_bytes(), 3u * 40u * 8u * sizeof(int16_t));
  ASSERT_NE((*cap)->buffer_data(), nullptr);
  const TensorView t1 = (*cap)->layer_target(1);
  EXPECT_EQ(t1.dtype, DType::kI16);
  EXPECT_EQ(t1.shape_string(), "[40, 8]");
  EXPECT_EQ(t1.ptr<int16_t>(), static_cast<const int16_t*>((*cap)->buffer_data()) + 40 * 8);
}

// Format v2 facts the capturer records: the prompt boundary of each request and
// the backend/kernel that produced the ids; they survive the file.
TEST(Capturer, RecordsPromptBoundaryAndBackendThroughTheFile) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 11);
  ASSERT_TRUE(model);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, s.k);
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(*model, **cap).ok());
  EXPECT_EQ((*cap)->info().backend, "CpuModular");  // built with create_with(): no backend name
  ASSERT_TRUE((*cap)->add_request("p", /*skip_prompt_tokens=*/1, /*prompt_tokens=*/3).ok());
  ASSERT_TRUE((*cap)->add_request("q").ok());
  EXPECT_FALSE((*cap)->add_request("r", 0, -2).ok());
  EXPECT_FALSE((*cap)->add_request("r", 4, 3).ok());  // the capture would start past the prompt's end
  for (const StepLayout& layout : {StepLayout{{{"p", 3}, {"q", 2}}}, StepLayout{{{"p", 1}, {"q", 1}}}}) {
    ASSERT_TRUE((*cap)->begin_step(layout).ok());
    auto in = make_step_inputs(s, layout.num_rows(), 12);
    ASSERT_TRUE(run_layers(*model, in).ok());
    ASSERT_TRUE((*cap)->end_step().ok());
  }
  auto set = (*cap)->snapshot();
  ASSERT_TRUE(set.ok());
  const std::string path = ::testing::TempDir() + "moekit_capturer_v2_" + std::to_string(::getpid());
  ASSERT_TRUE(write_capture_file(path, *set).ok());
  auto back = read_capture_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->info.backend, "CpuModular");
  const RequestCapture* p = back->find("p");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->first_token, 1);
  EXPECT_EQ(p->first_generated_token, 3);
  EXPECT_EQ(p->num_tokens(), 3);  // tokens 1, 2 (prompt) and 3 (the first generated one, fed back)
  EXPECT_EQ(back->find("q")->first_generated_token, -1);
  std::remove(path.c_str());
}

// On the CPU end_step_async is end_step: the rows are there at once, errors too.
TEST(Capturer, EndStepAsyncOnTheCpuChecksAtOnce) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 13);
  ASSERT_TRUE(model);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, s.k);
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("a").ok());
  EXPECT_EQ((*cap)->end_step_async().code(), StatusCode::kFailedPrecondition);  // no step begun
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"a", 2}}}).ok());
  auto in = make_step_inputs(s, 2, 14);
  ASSERT_TRUE(run_layers(*model, in).ok());
  ASSERT_TRUE((*cap)->end_step_async().ok());
  EXPECT_EQ((*cap)->routed_experts("a")->shape()[0], 2);
  EXPECT_TRUE((*cap)->collect().ok());  // nothing pending
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"a", 1}}}).ok());  // no layer runs: the row stays -1
  const Status st = (*cap)->end_step_async();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("still holds the sentinel -1"), std::string::npos) << st.message();
  EXPECT_EQ((*cap)->routed_experts("a")->shape()[0], 2);  // nothing of the bad step appended
}

TEST(Capturer, CreateRejectsBadSizes) {
  EXPECT_FALSE(RoutedExpertsCapturer::create(0, 8, 2).ok());
  EXPECT_FALSE(RoutedExpertsCapturer::create(2, 0, 2).ok());
  EXPECT_FALSE(RoutedExpertsCapturer::create(2, 8, 0).ok());
}

// ---------------------------------------------------------------- bind

TEST(Bind, ZeroLayersIsAnError) {
  Model empty;
  auto cap = RoutedExpertsCapturer::create(1, 8, 2);
  ASSERT_TRUE(cap.ok());
  Status st = bind(empty, **cap);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no MoE layers"), std::string::npos);
}

TEST(Bind, MonolithicWithoutReplayOutFailsNamingTheKernel) {
  ModelShape s;
  auto model = spy_model(spy_class<SpyMonolithic<false, false>>(), 2, s);
  auto cap = RoutedExpertsCapturer::create(2, s.max_tokens, s.k);
  ASSERT_TRUE(cap.ok());
  Status st = bind(*model, **cap);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("SpyNoReplayOut"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("MoE layer 0"), std::string::npos) << st.message();
  EXPECT_FALSE(model->layer(0).capture_target().defined());
  // The layer refuses the target directly too.
  EXPECT_FALSE(model->layer(0).set_capture_target((*cap)->layer_target(0)).ok());
}

TEST(Bind, MismatchesAreErrorsAndNothingIsHalfBound) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 2);
  ASSERT_TRUE(model);
  struct Case {
    int layers;
    int64_t rows;
    int k;
    const char* want;
  } cases[] = {
      {3, s.max_tokens, static_cast<int>(s.k), "2 MoE layers, the capturer 3"},
      {2, s.max_tokens, static_cast<int>(s.k) + 1, "top_k"},
      {2, s.max_tokens - 1, static_cast<int>(s.k), "capture buffer holds"},
  };
  for (const Case& c : cases) {
    auto cap = RoutedExpertsCapturer::create(c.layers, c.rows, c.k);
    ASSERT_TRUE(cap.ok());
    Status st = bind(*model, **cap);
    ASSERT_FALSE(st.ok()) << c.want;
    EXPECT_NE(st.message().find(c.want), std::string::npos) << st.message();
    for (int l = 0; l < model->num_layers(); ++l) EXPECT_FALSE(model->layer(l).capture_target().defined());
  }
}

TEST(Bind, LayersThatDisagreeOnRoutingAreAnError) {
  ModelShape a, b;
  a.num_layers = b.num_layers = 1;
  b.method = RoutingMethod::kSigmoid;
  std::mt19937_64 rng(3);
  auto la = testing::make_layer(a, "CpuModular", rng);
  auto lb = testing::make_layer(b, "CpuModular", rng);
  ASSERT_TRUE(la && lb);
  Model mixed;
  ASSERT_TRUE(mixed.add_layer(std::move(la), 0).ok());
  ASSERT_TRUE(mixed.add_layer(std::move(lb), 1).ok());
  auto cap = RoutedExpertsCapturer::create(2, a.max_tokens, a.k);
  Status st = bind(mixed, **cap);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("differs from MoE layer 0"), std::string::npos) << st.message();
  EXPECT_FALSE(mixed.layer(0).capture_target().defined());
}

TEST(Bind, StepCallsBeforeBindFail) {
  auto cap = RoutedExpertsCapturer::create(2, 8, 2);
  ASSERT_TRUE((*cap)->add_request("r").ok());
  Status st = (*cap)->begin_step(StepLayout{{{"r", 1}}});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------- the sentinel

TEST(Capturer, UnwrittenRowIsReportedNeverReadAsExpertZero) {
  ModelShape s;
  auto model = spy_model(spy_class<SpyMonolithic<true, /*skip last row=*/true>>(), 2, s);
  auto cap = RoutedExpertsCapturer::create(2, s.max_tokens, s.k);
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("a").ok());
  ASSERT_TRUE((*cap)->add_request("b").ok());
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"a", 3}, {"b", 2}}}).ok());
  auto in = make_step_inputs(s, 5, 9);
  ASSERT_TRUE(run_layers(*model, in).ok());
  Status st = (*cap)->end_step();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  // Row 4 is request b's second token.
  EXPECT_NE(st.message().find("sentinel -1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("step row 4 (request 'b', token 1)"), std::string::npos) << st.message();
  // Nothing was appended for the failed step.
  auto a = (*cap)->routed_experts("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape()[0], 0);
}

TEST(Capturer, StaleRowsFromAnEarlierStepAreResetToTheSentinel) {
  // Step 1 writes 5 rows; step 2 has 5 rows again but the kernel skips the last
  // one. Without the per-step reset, row 4 would still hold step 1's ids.
  ModelShape s;
  auto full = spy_model(spy_class<SpyMonolithic<true, false>>(), 1, s);
  auto skipping = spy_model(spy_class<SpyMonolithic<true, true>>(), 1, s);
  auto cap = RoutedExpertsCapturer::create(1, s.max_tokens, s.k);
  ASSERT_TRUE(bind(*full, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("a").ok());
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"a", 5}}}).ok());
  s.num_layers = 1;
  auto in = make_step_inputs(s, 5, 10);
  ASSERT_TRUE(run_layers(*full, in).ok());
  ASSERT_TRUE((*cap)->end_step().ok());
  ASSERT_TRUE(bind(*skipping, **cap).ok());
  ASSERT_TRUE((*cap)->begin_step(StepLayout{{{"a", 5}}}).ok());
  ASSERT_TRUE(run_layers(*skipping, in).ok());
  EXPECT_EQ((*cap)->end_step().code(), StatusCode::kDataLoss);
}

TEST(Capturer, BadLayoutsAreRejected) {
  ModelShape s;
  auto model = make_model(s, "CpuModular", 5);
  auto cap = RoutedExpertsCapturer::create(2, s.max_tokens, s.k);
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("a").ok());
  EXPECT_FALSE((*cap)->add_request("a").ok());
  EXPECT_FALSE((*cap)->add_request("neg", -1).ok());
  EXPECT_NE((*cap)->begin_step(StepLayout{{{"zzz", 1}}}).message().find("was not added"), std::string::npos);
  EXPECT_NE((*cap)->begin_step(StepLayout{{{"a", 1}, {"a", 1}}}).message().find("twice"), std::string::npos);
  EXPECT_FALSE((*cap)->begin_step(StepLayout{{{"a", 0}}}).ok());
  EXPECT_FALSE((*cap)->begin_step(StepLayout{{{"a", s.max_tokens + 1}}}).ok());
  EXPECT_FALSE((*cap)->begin_step(StepLayout{}).ok());
  EXPECT_EQ((*cap)->end_step().code(), StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------- accounting

// Steps of an engine: prefill chunks and decode tokens of several requests in
// one batch; request b skips its first 3 prompt tokens; c arrives later.
struct PlannedStep {
  std::vector<StepSegment> segments;
  std::vector<std::pair<std::string, int64_t>> add_before;  // (request, skip)
};

std::vector<PlannedStep> engine_schedule() {
  return {
      {{{"a", 6}, {"b", 5}}, {{"a", 0}, {"b", 3}}},  // a: prefill chunk 1; b: whole prompt
      {{{"a", 4}, {"b", 1}}, {}},                    // a: prefill chunk 2; b: decode
      {{{"b", 1}, {"a", 1}, {"c", 7}}, {{"c", 0}}},  // decode, decode, c's prompt
      {{{"c", 1}, {"a", 1}}, {}},                    // decode; b is idle this step
      {{{"b", 1}, {"c", 1}, {"a", 1}}, {}},
  };
}

class CaptureAccounting : public ::testing::TestWithParam<std::string> {};

TEST_P(CaptureAccounting, MultiRequestMultiStepMatchesAnIndependentExpectation) {
  ModelShape s;
  s.num_layers = 3;
  s.method = RoutingMethod::kSigmoidRenorm;
  auto model = make_model(s, GetParam(), testing::seed_from({11, GetParam() == "CpuModular"}));
  ASSERT_TRUE(model);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, s.k);
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(*model, **cap).ok());

  // expected[request] = list of [layers][k] id rows per kept token.
  std::map<std::string, std::vector<int32_t>> expected;
  std::map<std::string, int64_t> seen, skip;
  moekit_ref::RoutingParams rp;
  rp.method = routing_method_name(s.method);
  rp.top_k = static_cast<int>(s.k);

  int step_index = 0;
  for (const PlannedStep& ps : engine_schedule()) {
    for (const auto& [req, n] : ps.add_before) {
      ASSERT_TRUE((*cap)->add_request(req, n).ok());
      skip[req] = n;
    }
    StepLayout layout{ps.segments};
    const int64_t m = layout.num_rows();
    auto in = make_step_inputs(s, m, testing::seed_from({12, step_index++}));
    ASSERT_TRUE((*cap)->begin_step(layout).ok());
    ASSERT_TRUE(run_layers(*model, in).ok());
    ASSERT_TRUE((*cap)->end_step().ok());
    // The reference routes every layer's logits; rows are dealt to requests.
    std::vector<moekit_ref::RoutingResult> ref;
    for (int l = 0; l < s.num_layers; ++l) ref.push_back(moekit_ref::route(rp, in[l].logits_d, m, s.E));
    int64_t row = 0;
    for (const StepSegment& seg : ps.segments) {
      for (int64_t i = 0; i < seg.num_rows; ++i, ++row) {
        if (seen[seg.request]++ < skip[seg.request]) continue;
        for (int l = 0; l < s.num_layers; ++l) {
          for (int64_t j = 0; j < s.k; ++j) expected[seg.request].push_back(ref[l].ids[row * s.k + j]);
        }
      }
    }
  }
  const std::map<std::string, int64_t> want_tokens = {{"a", 13}, {"b", 5}, {"c", 9}};
  for (const auto& [req, tokens] : want_tokens) {
    auto got = (*cap)->routed_experts(req);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->shape(), (std::vector<int64_t>{tokens, s.num_layers, s.k})) << req;
    const std::vector<int32_t>& want = expected[req];
    ASSERT_EQ(static_cast<int64_t>(want.size()), got->numel());
    for (int64_t i = 0; i < got->numel(); ++i) {
      ASSERT_EQ(got->data<int16_t>()[i], want[i]) << "request " << req << " element " << i;
    }
  }
  // snapshot keeps the order requests were added and the skip as first_token.
  auto snap = (*cap)->snapshot();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->requests.size(), 3u);
  EXPECT_EQ(snap->requests[1].request, "b");
  EXPECT_EQ(snap->requests[1].first_token, 3);
  EXPECT_EQ(snap->info.model_layers, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(snap->info.num_experts, s.E);
  EXPECT_EQ(snap->info.routing.method, s.method);
  // finish_request hands the capture over and forgets the request.
  auto fin = (*cap)->finish_request("a");
  ASSERT_TRUE(fin.ok());
  EXPECT_EQ(fin->num_tokens(), 13);
  EXPECT_EQ((*cap)->routed_experts("a").status().code(), StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(CpuKernels, CaptureAccounting, ::testing::Values("CpuMonolithic", "CpuModular"));

}  // namespace
}  // namespace moekit
