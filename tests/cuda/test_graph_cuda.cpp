// A whole forward (routing + experts, several layers chained, capture on)
// captured in one CUDA graph and replayed with new inputs gives the same bits
// as eager execution: nothing in a forward allocates, synchronizes with the
// host or bakes an input value into the graph. And update_weights writes a
// layer's new weights where the graph reads them.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "moekit/capture.h"
#include "util/fp8_test_layer.h"

namespace moekit {
namespace {

using cuda_test::DeviceTensor;

class CudaGraphForward : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphForward, ReplayWithNewInputsEqualsEager) {
  MOEKIT_REQUIRE_SM90();
  const std::string kernel = GetParam();
  testing::ModelShape s;
  s.method = RoutingMethod::kDeepseekV3;  // bias, groups, scaling: the most state in a router
  s.E = 64;
  s.k = 8;
  s.H = 128;
  s.I = 64;
  s.max_tokens = 96;
  s.num_layers = 3;
  const int64_t M = 96;
  cuda_test::ModelPair models = cuda_test::make_model_pair(s, kernel, testing::seed_from({53, kernel == "Sm90Modular"}));
  ASSERT_TRUE(models.gpu);
  Model& model = *models.gpu;
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cuda(dev));
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("r").ok());

  // Fixed buffers: h[0] -> layer 0 -> h[1] -> layer 1 -> h[2] -> layer 2 -> h[3].
  std::vector<DeviceTensor> h, logits;
  for (int l = 0; l <= s.num_layers; ++l) h.emplace_back(DType::kBF16, std::vector<int64_t>{M, s.H});
  for (int l = 0; l < s.num_layers; ++l) logits.emplace_back(DType::kF32, std::vector<int64_t>{M, s.E});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  auto load_inputs = [&](uint64_t seed) {
    auto in = testing::make_step_inputs(s, M, seed);
    h[0].upload(in[0].hidden);
    for (int l = 0; l < s.num_layers; ++l) logits[l].upload(in[l].logits);
    for (int l = 1; l <= s.num_layers; ++l) h[l].poison();
  };
  auto forward = [&]() -> Status {
    for (int l = 0; l < s.num_layers; ++l) {
      LayerForwardArgs a;
      a.hidden = h[l].view();
      a.router_logits = logits[l].view();
      a.out = h[l + 1].view();
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a, stream));
    }
    return Status::Ok();
  };
  const StepLayout layout{{{"r", M}}};
  struct Result {
    std::vector<HostTensor> outs;
    HostTensor ids;
  };
  auto collect = [&]() {
    Result r;
    for (int l = 1; l <= s.num_layers; ++l) r.outs.push_back(h[l].download());
    return r;
  };

  // Eager, three input sets.
  std::vector<Result> eager;
  for (uint64_t seed : {1, 2, 3}) {
    load_inputs(seed);
    ASSERT_TRUE((*cap)->begin_step(layout, stream).ok());
    const Status st = forward();
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE((*cap)->end_step(stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    eager.push_back(collect());
  }
  EXPECT_NE(cuda_test::first_difference(eager[0].outs.back(), eager[1].outs.back()), "")
      << "different inputs must give different outputs";

  // One graph of the whole forward.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status cst = forward();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(cst.ok()) << cst.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // Replays in another order, with new inputs each time.
  for (int i : {2, 0, 1}) {
    load_inputs(static_cast<uint64_t>(i + 1));
    ASSERT_TRUE((*cap)->begin_step(layout, stream).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_TRUE((*cap)->end_step(stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const Result g = collect();
    for (int l = 0; l < s.num_layers; ++l) {
      EXPECT_EQ(cuda_test::first_difference(g.outs[l], eager[i].outs[l]), "")
          << "input set " << i << ", layer " << l << ": graph replay differs from eager";
    }
  }
  // Captured ids: steps 4..6 (graph) equal steps 1..3 (eager) in the replay order.
  auto ids = (*cap)->routed_experts("r");
  ASSERT_TRUE(ids.ok());
  const int64_t per_step = M * s.num_layers * s.k;
  const int16_t* all = ids->data<int16_t>();
  const int order[] = {2, 0, 1};
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(0, std::memcmp(all + (3 + j) * per_step, all + order[j] * per_step, per_step * sizeof(int16_t)))
        << "graph step " << j << ": captured ids differ from eager";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaGraphForward, ::testing::Values("Sm90Monolithic", "Sm90Modular"));

// A layer's update_weights keeps every buffer a captured graph reads: a graph
// captured with weights A and replayed after an update to B gives, bit for
// bit, what a layer made with B gives eagerly. bf16 (deepseek_v3, so the
// selection bias too) and fp8 block-128 (its tensor-core scale layouts).
class UpdateWeightsUnderAGraph : public ::testing::TestWithParam<bool> {};

TEST_P(UpdateWeightsUnderAGraph, AGraphCapturedBeforeTheUpdateRunsTheNewWeights) {
  MOEKIT_REQUIRE_SM90();
  const bool fp8 = GetParam();
  constexpr int64_t M = 96, E = 64, k = 8, H = 256, I = 128;
  struct Weights {
    MoeConfig config;
    std::shared_ptr<void> owner;
    MoeWeights w;
    HostTensor hidden, logits;
  };
  const auto make = [&](uint64_t seed) {
    Weights x;
    if (fp8) {
      auto f = std::make_shared<testing::Fp8Layer>(testing::Fp8Shape{M, E, k, H, I}, testing::Fp8Scheme::kBlock128,
                                                   Activation::kSiluGated, DType::kBF16, seed);
      x.config = f->config;
      x.w = f->weights();
      x.hidden = f->hidden;
      x.logits = f->logits;
      x.owner = f;
      return x;
    }
    std::mt19937_64 rng(seed);
    auto t = std::make_shared<std::vector<HostTensor>>();
    t->push_back(testing::random_tensor(rng, DType::kBF16, {E, 2 * I, H}, 1.0 / std::sqrt(double(H))));
    t->push_back(testing::random_tensor(rng, DType::kBF16, {E, H, I}, 1.0 / std::sqrt(double(I))));
    t->push_back(testing::random_tensor(rng, DType::kF32, {E}, 0.1));
    x.config.num_experts = E;
    x.config.hidden = H;
    x.config.intermediate = I;
    x.config.max_num_tokens = M;
    x.config.routing.method = RoutingMethod::kDeepseekV3;
    x.config.routing.top_k = k;
    x.config.routing.num_groups = 8;
    x.config.routing.topk_groups = 4;
    x.config.routing.has_score_bias = true;
    x.w = MoeWeights{(*t)[0].view(), (*t)[1].view(), (*t)[2].view()};
    x.hidden = testing::random_tensor(rng, DType::kBF16, {M, H}, 1.0);
    x.logits = testing::tie_free_logits(rng, DType::kF32, M, E, 1e-3);
    x.owner = t;
    return x;
  };
  const Weights a = make(testing::seed_from({71, fp8, 1})), b = make(testing::seed_from({71, fp8, 2}));
  auto layer = MoeLayer::create(a.config, a.w, Device::cuda(0));
  auto made_b = MoeLayer::create(b.config, b.w, Device::cuda(0));
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  ASSERT_TRUE(made_b.ok()) << made_b.status().to_string();
  DeviceTensor hidden(a.hidden), logits(a.logits), out(DType::kBF16, {M, H}), ref(DType::kBF16, {M, H});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  LayerForwardArgs f;
  f.hidden = hidden.view();
  f.router_logits = logits.view();
  f.out = out.view();
  ASSERT_TRUE((*layer)->forward(f, stream).ok());  // eager first: nothing left to set up at capture
  LayerForwardArgs g = f;
  g.out = ref.view();
  ASSERT_TRUE((*made_b)->forward(g, stream).ok());  // B's weights, eagerly
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const HostTensor out_a = out.download(), out_b = ref.download();
  ASSERT_NE(cuda_test::first_difference(out_a, out_b), "");
  // The same forward again, eagerly: the path gives the same bits every time (a
  // graph mismatch below is then the update's, not the kernel's).
  out.poison();
  ASSERT_TRUE((*layer)->forward(f, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cuda_test::first_difference(out.download(), out_a), "") << "A eagerly, a second time != A";

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status cst = (*layer)->forward(f, stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(cst.ok()) << cst.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  const Status up = (*layer)->update_weights(b.w);
  ASSERT_TRUE(up.ok()) << up.to_string();
  out.poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cuda_test::first_difference(out.download(), out_b), "") << "graph after the update != B eagerly";

  ASSERT_TRUE((*layer)->update_weights(a.w).ok());
  out.poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cuda_test::first_difference(out.download(), out_a), "") << "graph after updating back != A";
  out.poison();
  ASSERT_TRUE((*layer)->forward(f, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cuda_test::first_difference(out.download(), out_a), "") << "eager after updating back != A";
  // Updates from host memory, each launched at once on the non-blocking stream: an
  // update returns only once its copies (weights and score bias) have landed.
  for (int round = 0; round < 8; ++round) {
    const bool to_b = round % 2 == 0;
    ASSERT_TRUE((*layer)->update_weights(to_b ? b.w : a.w).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cuda_test::first_difference(out.download(), to_b ? out_b : out_a), "")
        << "graph right after update " << round << " != " << (to_b ? "B" : "A");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Weights, UpdateWeightsUnderAGraph, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "fp8_block128" : "bf16"; });

}  // namespace
}  // namespace moekit
