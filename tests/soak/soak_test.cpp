// Soak: 10^5 forwards of varying M through a CPU model with capture on, the
// way an engine runs for hours. Every step's capture must hold every row (no
// -1 left by a forward that did not write), and memory must stay flat: the
// live heap and the resident set after the last step are those after warm-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "capture/capture_test_util.h"
#include "moekit/capture.h"
#include "soak/memory_probe.h"

namespace moekit {
namespace {

constexpr int64_t kForwards = 100000;
constexpr int64_t kWarmupSteps = 2000;
// NOTE: the heap holds the same buffers in every step (request bookkeeping is
// freed when each request finishes), so it may not grow at all; the slack is
// for the allocator's own tables. The resident set may grow by what malloc
// keeps of freed blocks of different sizes (M varies), never per step.
constexpr size_t kHeapSlack = 64 << 10;
constexpr size_t kResidentSlack = 8 << 20;

TEST(Soak, HundredThousandForwardsWithCaptureKeepMemoryFlat) {
  testing::ModelShape s;
  s.E = 16;
  s.k = 4;
  s.H = 32;
  s.I = 16;
  s.max_tokens = 24;
  s.num_layers = 2;
  // One layer of each CPU class: the monolithic kernel writes the capture
  // rows itself, the modular one through the router.
  std::mt19937_64 rng(testing::seed_from({77, s.E, s.k}));
  Model model;
  ASSERT_TRUE(model.add_layer(testing::make_layer(s, "CpuMonolithic", rng), 1).ok());
  ASSERT_TRUE(model.add_layer(testing::make_layer(s, "CpuModular", rng), 3).ok());
  auto capturer = RoutedExpertsCapturer::create(s.num_layers, s.max_tokens, static_cast<int>(s.k));
  ASSERT_TRUE(capturer.ok());
  ASSERT_TRUE(bind(model, **capturer).ok());

  // Inputs for the largest step; a step of M rows uses the first M.
  std::vector<testing::LayerStep> in = testing::make_step_inputs(s, s.max_tokens, testing::seed_from({78}));

  const int64_t steps = kForwards / s.num_layers;
  int64_t rows = 0, forwards = 0, bad_ids = 0;
  size_t heap_after_warmup = 0, resident_after_warmup = 0;
  for (int64_t step = 0; step < steps; ++step) {
    if (step == kWarmupSteps) {
      heap_after_warmup = testing::heap_bytes_in_use();
      resident_after_warmup = testing::resident_bytes();
    }
    const int64_t M = 1 + (step * 7919) % s.max_tokens;  // every M in [1, 24], in no simple order
    const std::string request = "r" + std::to_string(step);
    ASSERT_TRUE((*capturer)->add_request(request).ok());
    ASSERT_TRUE((*capturer)->begin_step(StepLayout{{{request, M}}}).ok());
    for (int l = 0; l < s.num_layers; ++l) {
      LayerForwardArgs a;
      a.hidden = TensorView::contiguous(in[l].hidden.data<uint8_t>(), s.act, {M, s.H});
      a.router_logits = TensorView::contiguous(in[l].logits.data<uint8_t>(), s.logits, {M, s.E});
      a.out = TensorView::contiguous(in[l].out.data<uint8_t>(), s.act, {M, s.H});
      const Status st = model.layer(l).forward(a);
      ASSERT_TRUE(st.ok()) << "step " << step << " layer " << l << ": " << st.to_string();
      ++forwards;
    }
    // end_step refuses a row still -1 (unwritten) or out of range; count them
    // here too from what the request got.
    const Status end = (*capturer)->end_step();
    ASSERT_TRUE(end.ok()) << "step " << step << ": " << end.to_string();
    auto done = (*capturer)->finish_request(request);
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    ASSERT_EQ(done->ids.shape(), (std::vector<int64_t>{M, s.num_layers, s.k}));
    const int16_t* ids = done->ids.data<int16_t>();
    bad_ids += std::count_if(ids, ids + done->ids.numel(), [&](int16_t id) { return id < 0 || id >= s.E; });
    rows += M;
  }
  const size_t heap_end = testing::heap_bytes_in_use(), resident_end = testing::resident_bytes();
  std::printf("soak: %lld forwards, %lld rows captured, %lld unwritten or out-of-range ids; heap %zu -> %zu bytes, "
              "resident %zu -> %zu KiB\n",
              static_cast<long long>(forwards), static_cast<long long>(rows), static_cast<long long>(bad_ids),
              heap_after_warmup, heap_end, resident_after_warmup >> 10, resident_end >> 10);
  EXPECT_GE(forwards, kForwards);
  EXPECT_EQ(bad_ids, 0);
  EXPECT_LE(heap_end, heap_after_warmup + kHeapSlack) << "the live heap grew";
  if (testing::resident_set_is_meaningful()) {
    EXPECT_LE(resident_end, resident_after_warmup + kResidentSlack) << "the resident set grew";
  } else {
    std::printf("soak: resident set not compared (AddressSanitizer's quarantine keeps freed memory resident)\n");
  }
}

}  // namespace
}  // namespace moekit
