// GPU soak: 10^5 forwards of varying M through a cuda_sm90 model (one layer of
// each class) with capture on. Every step's capture must hold every row, and
// memory must stay flat: free device memory, the host's live heap and its
// resident set after the last step are those after warm-up.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "moekit/capture.h"
#include "soak/memory_probe.h"

namespace moekit {
namespace {

constexpr int64_t kForwards = 100000;
constexpr int64_t kWarmupSteps = 2000;
constexpr size_t kDeviceSlack = 2 << 20;    // cudaMemGetInfo's granularity
constexpr size_t kHeapSlack = 64 << 10;     // as the CPU soak (tests/soak/soak_test.cpp)
constexpr size_t kResidentSlack = 16 << 20;  // the CPU soak's, plus room for the CUDA runtime's host caches

TEST(CudaSoak, HundredThousandForwardsWithCaptureKeepMemoryFlat) {
  MOEKIT_REQUIRE_SM90();
  testing::ModelShape s;  // E 16, k 4, H 64, I 32, up to 32 rows
  int dev = 0;
  ASSERT_CUDA_OK(cudaGetDevice(&dev));
  const Device device = Device::cuda(dev);
  const MoeConfig cfg = testing::config_for(s);
  std::mt19937_64 rng(testing::seed_from({79, s.E, s.k}));
  Model model;
  std::vector<HostTensor> keep;
  for (const char* kernel : {"Sm90Monolithic", "Sm90Modular"}) {
    keep.push_back(testing::random_tensor(rng, s.act, {s.E, 2 * s.I, s.H}, 0.1));
    keep.push_back(testing::random_tensor(rng, s.act, {s.E, s.H, s.I}, 0.1));
    const MoeWeights w{keep[keep.size() - 2].view(), keep.back().view(), {}};
    auto layer = MoeLayer::create_with(cfg, w, cuda_test::gpu_kernel_class(kernel), Platform::probe());
    ASSERT_TRUE(layer.ok()) << layer.status().to_string();
    ASSERT_TRUE(model.add_layer(std::move(layer).value(), 2 * model.num_layers() + 1).ok());
  }
  auto capturer = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k), device);
  ASSERT_TRUE(capturer.ok());
  ASSERT_TRUE(bind(model, **capturer).ok());

  // Device inputs for the largest step; a step of M rows uses the first M.
  std::vector<testing::LayerStep> host = testing::make_step_inputs(s, s.max_tokens, testing::seed_from({80}));
  std::vector<cuda_test::DeviceStep> in;
  for (const auto& h : host) in.emplace_back(h);

  const int64_t steps = kForwards / s.num_layers;
  int64_t forwards = 0, bad_ids = 0;
  size_t free_after_warmup = 0, total = 0, heap_after_warmup = 0, resident_after_warmup = 0;
  for (int64_t step = 0; step < steps; ++step) {
    if (step == kWarmupSteps) {
      ASSERT_CUDA_OK(cudaMemGetInfo(&free_after_warmup, &total));
      heap_after_warmup = testing::heap_bytes_in_use();
      resident_after_warmup = testing::resident_bytes();
    }
    const int64_t M = 1 + (step * 7919) % s.max_tokens;
    const std::string request = "r" + std::to_string(step);
    ASSERT_TRUE((*capturer)->add_request(request).ok());
    ASSERT_TRUE((*capturer)->begin_step(StepLayout{{{request, M}}}).ok());
    for (int l = 0; l < s.num_layers; ++l) {
      LayerForwardArgs a;
      a.hidden = TensorView::contiguous(in[l].hidden.data(), s.act, {M, s.H}, device);
      a.router_logits = TensorView::contiguous(in[l].logits.data(), s.logits, {M, s.E}, device);
      a.out = TensorView::contiguous(in[l].out.data(), s.act, {M, s.H}, device);
      const Status st = model.layer(l).forward(a);
      ASSERT_TRUE(st.ok()) << "step " << step << " layer " << l << ": " << st.to_string();
      ++forwards;
    }
    const Status end = (*capturer)->end_step();  // waits for the stream, refuses rows left -1
    ASSERT_TRUE(end.ok()) << "step " << step << ": " << end.to_string();
    auto done = (*capturer)->finish_request(request);
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    const int16_t* ids = done->ids.data<int16_t>();
    bad_ids += std::count_if(ids, ids + done->ids.numel(), [&](int16_t id) { return id < 0 || id >= s.E; });
  }
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  size_t free_end = 0;
  ASSERT_CUDA_OK(cudaMemGetInfo(&free_end, &total));
  const size_t heap_end = testing::heap_bytes_in_use(), resident_end = testing::resident_bytes();
  std::printf("cuda soak: %lld forwards, %lld bad ids; device free %zu -> %zu MiB, heap %zu -> %zu bytes, "
              "resident %zu -> %zu KiB\n",
              static_cast<long long>(forwards), static_cast<long long>(bad_ids), free_after_warmup >> 20,
              free_end >> 20, heap_after_warmup, heap_end, resident_after_warmup >> 10, resident_end >> 10);
  EXPECT_GE(forwards, kForwards);
  EXPECT_EQ(bad_ids, 0);
  EXPECT_GE(free_end + kDeviceSlack, free_after_warmup) << "device memory in use grew";
  EXPECT_LE(heap_end, heap_after_warmup + kHeapSlack) << "the live heap grew";
  if (testing::resident_set_is_meaningful()) {
    EXPECT_LE(resident_end, resident_after_warmup + kResidentSlack) << "the resident set grew";
  }
}

}  // namespace
}  // namespace moekit
