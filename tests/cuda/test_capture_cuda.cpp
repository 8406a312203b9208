// Capture and replay on the GPU: a multi-layer, multi-request run through the
// capturer gives the same per-request ids as the CPU backend, and replaying the
// capture file reproduces the GPU outputs bit for bit, for every built-in
// routing method on both cuda_sm90 classes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "cuda/cuda_model_util.h"
#include "moekit/capture.h"

namespace moekit {
namespace {

using testing::kBuiltInMethods;
using testing::LayerStep;
using testing::make_step_inputs;
using testing::ModelShape;
using testing::two_request_schedule;

// GPU vs CPU layer outputs: both bf16 layers within ~2e-3 (rms) of the truth
// (see test_layer_cuda.cpp), so within 1e-2 of each other with margin.
constexpr double kBackendBound = 1e-2;

using Param = std::tuple<RoutingMethod, std::string>;
class CudaCaptureReplay : public ::testing::TestWithParam<Param> {};

TEST_P(CudaCaptureReplay, CaptureEqualsCpuAndReplayIsBitExact) {
  MOEKIT_REQUIRE_SM90();
  const auto& [method, kernel] = GetParam();
  const ModelShape s = testing::replay_shape(method);
  const uint64_t seed = testing::seed_from({41, static_cast<int64_t>(method), kernel == "Sm90Modular"});
  cuda_test::ModelPair models = cuda_test::make_model_pair(s, kernel, seed);
  ASSERT_TRUE(models.cpu && models.gpu);
  ASSERT_EQ(models.gpu->moe_layer(0)->kernel().name(), cuda_test::gpu_kernel_class(kernel).name);
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);

  auto cpu_cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k));
  auto gpu_cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cuda(dev));
  ASSERT_TRUE(cpu_cap.ok() && gpu_cap.ok());
  ASSERT_TRUE(bind(*models.cpu, **cpu_cap).ok());
  const Status bst = bind(*models.gpu, **gpu_cap);
  ASSERT_TRUE(bst.ok()) << bst.to_string();
  for (auto* cap : {cpu_cap->get(), gpu_cap->get()}) {
    ASSERT_TRUE(cap->add_request("p").ok());
    ASSERT_TRUE(cap->add_request("q").ok());
  }

  // Record on both backends with the same inputs.
  std::vector<std::vector<LayerStep>> recorded;
  for (size_t i = 0; i < two_request_schedule().size(); ++i) {
    const StepLayout& layout = two_request_schedule()[i];
    auto cpu_in = make_step_inputs(s, layout.num_rows(), seed + i);
    auto gpu_in = make_step_inputs(s, layout.num_rows(), seed + i);
    ASSERT_TRUE((*cpu_cap)->begin_step(layout).ok());
    ASSERT_TRUE(testing::run_layers(*models.cpu, cpu_in).ok());
    ASSERT_TRUE((*cpu_cap)->end_step().ok());
    ASSERT_TRUE((*gpu_cap)->begin_step(layout).ok());
    const Status st = cuda_test::run_gpu_layers(*models.gpu, gpu_in);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const Status end = (*gpu_cap)->end_step();
    ASSERT_TRUE(end.ok()) << end.to_string();
    for (int l = 0; l < s.num_layers; ++l) {
      const double err = testing::rel_l2_error(testing::to_double(gpu_in[l].out.view()),
                                               testing::to_double(cpu_in[l].out.view()));
      EXPECT_LE(err, kBackendBound) << "step " << i << " layer " << l << ": GPU vs CPU output";
    }
    recorded.push_back(std::move(gpu_in));
  }
  for (const char* req : {"p", "q"}) {
    auto a = (*cpu_cap)->routed_experts(req);
    auto b = (*gpu_cap)->routed_experts(req);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->shape(), b->shape()) << req;
    EXPECT_EQ(cuda_test::first_difference(*a, *b), "") << "request " << req << ": GPU capture differs from the CPU's";
  }

  // Replay the GPU capture from its file on the GPU model: bit-exact outputs, same ids.
  auto snap = (*gpu_cap)->snapshot();
  ASSERT_TRUE(snap.ok());
  const std::string path = ::testing::TempDir() + "moekit_cuda_replay_" + std::to_string(::getpid()) + ".safetensors";
  ASSERT_TRUE(write_capture_file(path, *snap).ok());
  auto file = read_capture_file(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto replayer = RoutedExpertsReplayer::create(*file, *models.gpu);
  ASSERT_TRUE(replayer.ok()) << replayer.status().to_string();
  auto cap2 = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cuda(dev));
  ASSERT_TRUE(bind(*models.gpu, **cap2).ok());
  ASSERT_TRUE((*cap2)->add_request("p").ok());
  ASSERT_TRUE((*cap2)->add_request("q").ok());
  for (size_t i = 0; i < two_request_schedule().size(); ++i) {
    auto again = make_step_inputs(s, two_request_schedule()[i].num_rows(), seed + i);
    ASSERT_TRUE((*replayer)->begin_step(two_request_schedule()[i]).ok());
    ASSERT_TRUE((*cap2)->begin_step(two_request_schedule()[i]).ok());
    const Status st = cuda_test::run_gpu_layers(*models.gpu, again, replayer->get());
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE((*cap2)->end_step().ok());
    for (int l = 0; l < s.num_layers; ++l) {
      EXPECT_EQ(cuda_test::first_difference(recorded[i][l].out, again[l].out), "")
          << "step " << i << " layer " << l << ": replay differs from the recorded output";
    }
  }
  for (const char* req : {"p", "q"}) {
    auto a = (*gpu_cap)->routed_experts(req);
    auto b = (*cap2)->routed_experts(req);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(cuda_test::first_difference(*a, *b), "") << req;
  }
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaCaptureReplay,
                         ::testing::Combine(::testing::ValuesIn(kBuiltInMethods),
                                            ::testing::Values("Sm90Monolithic", "Sm90Modular")),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(routing_method_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param);
                         });

// end_step_async: no wait per step; the rows are checked and appended when the
// next step ends (or a reader collects them), and equal end_step's.
TEST(CudaCapture, EndStepAsyncGivesTheRowsOfEndStep) {
  MOEKIT_REQUIRE_SM90();
  const ModelShape s = testing::replay_shape(RoutingMethod::kRenormalize);
  cuda_test::ModelPair models = cuda_test::make_model_pair(s, "Sm90Monolithic", 61);
  ASSERT_TRUE(models.gpu);
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  std::vector<HostTensor> got[2];
  for (int async = 0; async < 2; ++async) {
    auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cuda(dev));
    ASSERT_TRUE(cap.ok());
    ASSERT_TRUE(bind(*models.gpu, **cap).ok());
    ASSERT_TRUE((*cap)->add_request("p").ok());
    ASSERT_TRUE((*cap)->add_request("q").ok());
    for (size_t i = 0; i < two_request_schedule().size(); ++i) {
      auto in = make_step_inputs(s, two_request_schedule()[i].num_rows(), 62 + i);
      ASSERT_TRUE((*cap)->begin_step(two_request_schedule()[i]).ok());
      ASSERT_TRUE(cuda_test::run_gpu_layers(*models.gpu, in).ok());
      const Status end = async ? (*cap)->end_step_async() : (*cap)->end_step();
      ASSERT_TRUE(end.ok()) << end.to_string();
    }
    for (const char* req : {"p", "q"}) {
      auto ids = (*cap)->routed_experts(req);  // collects the last pending step
      ASSERT_TRUE(ids.ok()) << ids.status().to_string();
      got[async].push_back(std::move(*ids));
    }
  }
  for (size_t r = 0; r < got[0].size(); ++r) {
    ASSERT_EQ(got[0][r].shape(), got[1][r].shape());
    EXPECT_EQ(cuda_test::first_difference(got[0][r], got[1][r]), "") << "request " << r;
  }
}

}  // namespace
}  // namespace moekit
