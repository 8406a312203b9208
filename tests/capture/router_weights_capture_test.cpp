// The capturer's optional router weights (CapturerOptions::record_router_weights):
// off by default (nothing allocated for them, none in the capture); on, every
// captured row carries the weights the routing method gives its ids, for both
// CPU kernel classes, and they survive the capture file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <unistd.h>

#include "capture/capture_test_util.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

using testing::make_model;
using testing::make_step_inputs;
using testing::ModelShape;
using testing::run_layers;
using testing::two_request_schedule;

// The ids and weights route_cpu gives one layer's logits (the expectation).
struct Routed {
  HostTensor ids, weights;  // [M, k] i32, [M, k] f32
};
Routed route_expected(const MoeConfig& cfg, const HostTensor& logits) {
  const int64_t m = logits.shape()[0], k = cfg.top_k();
  Routed r{HostTensor(DType::kI32, {m, k}), HostTensor(DType::kF32, {m, k})};
  RoutingArgs a;
  a.logits = logits.view();
  a.topk_ids = r.ids.view();
  a.topk_weights = r.weights.view();
  EXPECT_TRUE(route_cpu(cfg.routing, a).ok());
  return r;
}

TEST(RouterWeightsCapture, OffByDefault) {
  ModelShape s = testing::replay_shape(RoutingMethod::kSigmoidRenorm);
  auto model = make_model(s, "CpuModular", 71);
  ASSERT_TRUE(model);
  auto ids_only = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k));
  auto with = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cpu(), true,
                                            CapturerOptions{true});
  ASSERT_TRUE(ids_only.ok() && with.ok());
  EXPECT_FALSE((*ids_only)->records_router_weights());
  EXPECT_FALSE((*ids_only)->layer_router_weights_target(0).defined());
  // f32 weights beside i16 ids: three times the ids' bytes in all.
  EXPECT_EQ((*with)->allocated_bytes(), 3 * (*ids_only)->allocated_bytes());
  ASSERT_TRUE(bind(*model, **ids_only).ok());
  EXPECT_FALSE(model->layer(0).router_weights_target().defined());
  ASSERT_TRUE((*ids_only)->add_request("r").ok());
  auto in = make_step_inputs(s, 5, 72);
  ASSERT_TRUE((*ids_only)->begin_step(StepLayout{{{"r", 5}}}).ok());
  ASSERT_TRUE(run_layers(*model, in).ok());
  ASSERT_TRUE((*ids_only)->end_step().ok());
  auto snap = (*ids_only)->snapshot();
  ASSERT_TRUE(snap.ok());
  EXPECT_FALSE(snap->info.router_weights_dtype.has_value());
  EXPECT_TRUE(snap->requests[0].router_weights.shape().empty());
}

class RouterWeightsCaptureKernel : public ::testing::TestWithParam<const char*> {};

TEST_P(RouterWeightsCaptureKernel, RowsCarryTheRoutingWeightsOfTheirIds) {
  const ModelShape s = testing::replay_shape(RoutingMethod::kSigmoidRenorm);
  const MoeConfig cfg = testing::config_for(s);
  auto model = make_model(s, GetParam(), 73);
  ASSERT_TRUE(model);
  auto cap = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), Device::cpu(), true,
                                           CapturerOptions{true});
  ASSERT_TRUE(cap.ok());
  ASSERT_TRUE(bind(*model, **cap).ok());
  ASSERT_TRUE((*cap)->add_request("p").ok());
  ASSERT_TRUE((*cap)->add_request("q").ok());

  // Expected [tokens, layers, k] per request, built from route_cpu step by step.
  std::map<std::string, std::vector<int16_t>> want_ids;
  std::map<std::string, std::vector<float>> want_weights;
  for (size_t i = 0; i < two_request_schedule().size(); ++i) {
    const StepLayout& step = two_request_schedule()[i];
    auto in = make_step_inputs(s, step.num_rows(), 74 + i);
    std::vector<Routed> routed;
    for (const auto& layer_in : in) routed.push_back(route_expected(cfg, layer_in.logits));
    ASSERT_TRUE((*cap)->begin_step(step).ok());
    ASSERT_TRUE(run_layers(*model, in).ok());
    ASSERT_TRUE((*cap)->end_step().ok());
    int64_t row0 = 0;
    for (const StepSegment& seg : step.segments) {
      for (int64_t r = row0; r < row0 + seg.num_rows; ++r) {
        for (int l = 0; l < s.num_layers; ++l) {
          for (int64_t j = 0; j < s.k; ++j) {
            want_ids[seg.request].push_back(static_cast<int16_t>(routed[l].ids.data<int32_t>()[r * s.k + j]));
            want_weights[seg.request].push_back(routed[l].weights.data<float>()[r * s.k + j]);
          }
        }
      }
      row0 += seg.num_rows;
    }
  }

  auto snap = (*cap)->snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  ASSERT_TRUE(snap->info.router_weights_dtype.has_value());
  EXPECT_EQ(*snap->info.router_weights_dtype, DType::kF32);
  for (const RequestCapture& rc : snap->requests) {
    ASSERT_FALSE(rc.router_weights.shape().empty()) << rc.request;
    ASSERT_EQ(rc.router_weights.shape(), rc.ids.shape()) << rc.request;
    ASSERT_EQ(rc.ids.numel(), static_cast<int64_t>(want_ids[rc.request].size()));
    EXPECT_EQ(0, std::memcmp(rc.ids.data<int16_t>(), want_ids[rc.request].data(), rc.ids.nbytes())) << rc.request;
    // The weights the routing method gives: bit for bit (the same router ran).
    EXPECT_EQ(0, std::memcmp(rc.router_weights.data<float>(), want_weights[rc.request].data(),
                             rc.router_weights.nbytes()))
        << rc.request;
  }

  // Through the file (format v2, router_weights = f32) unchanged.
  const std::string path =
      ::testing::TempDir() + "moekit_router_weights_" + std::to_string(::getpid()) + "_" + GetParam() + ".safetensors";
  ASSERT_TRUE(write_capture_file(path, *snap).ok());
  auto back = read_capture_file(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_TRUE(back->info.router_weights_dtype.has_value());
  EXPECT_EQ(*back->info.router_weights_dtype, DType::kF32);
  ASSERT_EQ(back->requests.size(), snap->requests.size());
  for (size_t i = 0; i < snap->requests.size(); ++i) {
    const HostTensor &a = snap->requests[i].router_weights, &b = back->requests[i].router_weights;
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << snap->requests[i].request;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, RouterWeightsCaptureKernel, ::testing::Values("CpuMonolithic", "CpuModular"));

}  // namespace
}  // namespace moekit
