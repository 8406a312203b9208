// The GPU expert-parallel path on ONE GPU: N ranks as threads over a
// device-loopback communicator (cuda/device_loopback_comm.h), so the device
// dispatch, experts and combine run without NCCL or a second GPU; and the
// sm90 modular kernel's skip_negative_ids on its own.
//   - EP-N (N = 2, 3) on a small DeepSeek-like shape equals the single-GPU
//     layer within the documented bound, ids identical, replay bitwise;
//   - the same with an EPLB placement;
//   - rebalance() (rebuilt, then in place): bitwise a layer created on the placement;
//   - capture through bind() on a Model of EP layers: ids and router weights
//     bit for bit the single-GPU layer's, replay through the replayer bitwise;
//   - skip_negative_ids: a -1 slot adds nothing (bitwise as weight 0 on a real
//     expert), a row of -1 gives 0; without the flag such a row stays NaN.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <functional>
#include <memory>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/device_loopback_comm.h"
#include "cuda/ep_gpu_test_util.h"
#include "experts/cuda/sm90_kernels.h"
#include "moekit/capture.h"
#include "moekit/kernel.h"

namespace moekit {
namespace {

using namespace ep_gpu_test;
using cuda_test::DeviceBytes;
using cuda_test::DeviceTensor;

class EpLayerOneGpu : public ::testing::TestWithParam<int> {};

TEST_P(EpLayerOneGpu, EqualsTheSingleGpuLayerCapturesTheSameIdsAndReplaysBitwise) {
  MOEKIT_REQUIRE_SM90();
  const int n = GetParam();
  const Inputs in(n);
  const Reference ref = single_gpu(in);
  ASSERT_GT(ref.out.numel(), 0);
  std::vector<RankResult> ep(n);
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& c, cudaStream_t s) {
    return capture_then_replay(r, c, s, in, nullptr, &ep[r]);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  expect_equals_single_gpu(in, ep, ref);
}

TEST_P(EpLayerOneGpu, WithEplbReplicasTheSameHolds) {
  MOEKIT_REQUIRE_SM90();
  const int n = GetParam();
  const Inputs in(n);
  const Reference ref = single_gpu(in);
  ASSERT_GT(ref.out.numel(), 0);
  StatusOr<ExpertPlacement> plan = eplb_placement(n);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::vector<RankResult> ep(n);
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& c, cudaStream_t s) {
    return capture_then_replay(r, c, s, in, &*plan, &ep[r]);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  expect_equals_single_gpu(in, ep, ref);
}

// rebalance() on GPU ranks: from the contiguous placement to an EPLB one with
// more slots per rank (the experts stage is built anew), then to another EPLB
// plan with as many slots per rank (in place: the workspace keeps its
// address). After each, the output is bit for bit that of a layer created on
// that placement (which the test above holds to the single-GPU layer).
TEST_P(EpLayerOneGpu, RebalanceEqualsALayerCreatedOnThePlacement) {
  MOEKIT_REQUIRE_SM90();
  const int n = GetParam();
  const Inputs in(n);
  StatusOr<ExpertPlacement> first = eplb_placement(n, 7), second = eplb_placement(n, 5);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(first->slots_per_rank, second->slots_per_rank);
  ASSERT_NE(first->to_string(), second->to_string());
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& comm, cudaStream_t s) -> Status {
    const std::string rank = "rank " + std::to_string(r) + ": ";
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rank_config(n, r), in.weights(), comm));
    RankStep step(in, r);
    const auto output_of = [&](ExpertParallelLayer& l) -> StatusOr<HostTensor> {
      step.out.poison();
      MOEKIT_RETURN_IF_ERROR(l.forward(step.args(), s));
      if (cudaStreamSynchronize(s) != cudaSuccess) return Internal(rank + "forward failed");
      return step.out.download();
    };
    MOEKIT_RETURN_IF_ERROR(output_of(*layer).status());
    for (const ExpertPlacement* plan : {&*first, &*second}) {
      const bool in_place = plan->slots_per_rank == layer->placement().slots_per_rank;
      const void* workspace = layer->workspace_buffer()->data();
      MOEKIT_RETURN_IF_ERROR(layer->rebalance(*plan));
      if (layer->placement().to_string() != plan->to_string()) return DataLoss(rank + "placement not taken");
      if (in_place && layer->workspace_buffer()->data() != workspace) {
        return DataLoss(rank + "an in-place rebalance moved the workspace");
      }
      MOEKIT_ASSIGN_OR_RETURN(const HostTensor rebalanced, output_of(*layer));
      MOEKIT_ASSIGN_OR_RETURN(auto created, ExpertParallelLayer::create(rank_config(n, r), in.weights(), comm, plan));
      MOEKIT_ASSIGN_OR_RETURN(const HostTensor reference, output_of(*created));
      const std::string diff = cuda_test::first_difference(rebalanced, reference);
      if (!diff.empty()) {
        return DataLoss(rank + (in_place ? "in place" : "rebuilt") + ": differs from a layer created on the placement: " +
                        diff);
      }
    }
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
}

// Custom routing on GPU ranks runs the same pipeline after the routing stage:
// given the router's own ids and weights, a custom-routed EP layer's output,
// expert counts, captured ids, load and computed pairs equal the routed one's.
TEST_P(EpLayerOneGpu, CustomRoutingWithTheRoutersIdsAndWeightsIsTheRoutedLayer) {
  MOEKIT_REQUIRE_SM90();
  const int n = GetParam();
  const Inputs in(n);
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& comm, cudaStream_t s) -> Status {
    MOEKIT_ASSIGN_OR_RETURN(auto routed, ExpertParallelLayer::create(rank_config(n, r), in.weights(), comm));
    MoeConfig cc = rank_config(n, r);
    cc.routing.method = RoutingMethod::kCustom;
    cc.routing.has_score_bias = false;
    MoeWeights cw = in.weights();
    cw.score_bias = {};
    MOEKIT_ASSIGN_OR_RETURN(auto custom, ExpertParallelLayer::create(cc, cw, comm));
    const int64_t m = tokens_of(r);
    RankStep step(in, r);
    cuda_test::DeviceTensor ids(DType::kI16, {kMaxPerRank, kK}), weights(DType::kF32, {kMaxPerRank, kK}),
        counts(DType::kI32, {kE}), ids_b(DType::kI16, {kMaxPerRank, kK}), counts_b(DType::kI32, {kE}),
        out_b(DType::kBF16, {m, kH});
    MOEKIT_RETURN_IF_ERROR(routed->set_capture_target(ids.view(), weights.view()));
    MOEKIT_RETURN_IF_ERROR(custom->set_capture_target(ids_b.view()));
    LayerForwardArgs a = step.args();
    a.expert_counts = counts.view();
    MOEKIT_RETURN_IF_ERROR(routed->forward(a, s));
    if (cudaStreamSynchronize(s) != cudaSuccess) return Internal("routed forward failed");
    const HostTensor ids_i32 = ids_as_i32(ids.download(), m);
    cuda_test::DeviceTensor topk_ids(ids_i32), topk_weights(rows(weights.download(), 0, m));
    out_b.poison();
    counts_b.poison();
    LayerForwardArgs b;
    b.hidden = step.hidden.view();
    b.out = out_b.view();
    b.topk_ids = topk_ids.view();
    b.topk_weights = topk_weights.view();
    b.expert_counts = counts_b.view();
    MOEKIT_RETURN_IF_ERROR(custom->forward(b, s));
    if (cudaStreamSynchronize(s) != cudaSuccess) return Internal("custom forward failed");
    const std::string rank = "rank " + std::to_string(r) + ": ";
    std::string diff = cuda_test::first_difference(out_b.download(), step.out.download());
    if (!diff.empty()) return DataLoss(rank + "custom output differs: " + diff);
    diff = cuda_test::first_difference(counts_b.download(), counts.download());
    if (!diff.empty()) return DataLoss(rank + "expert counts differ: " + diff);
    diff = cuda_test::first_difference(rows(ids_b.download(), 0, m), rows(ids.download(), 0, m));
    if (!diff.empty()) return DataLoss(rank + "captured ids differ: " + diff);
    if (custom->expert_load() != routed->expert_load()) return DataLoss(rank + "expert load differs");
    int64_t counted = 0;
    for (int64_t e : routed->expert_load()) counted += e;
    if (counted != m * kK) return DataLoss(rank + "expert load sums to " + std::to_string(counted));
    if (custom->computed_pairs() != routed->computed_pairs() || routed->computed_pairs() == 0) {
      return DataLoss(rank + "computed pairs differ or are 0");
    }
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
}

// Capture and replay through bind() on a Model of GPU EP layers: each rank's
// capture of its own tokens (logical ids and router weights, every layer)
// equals, bit for bit, the single-GPU layer's for the same rows; a replayer
// over the EP model then reproduces the rank's outputs bit for bit.
TEST_P(EpLayerOneGpu, BindCapturesWhatTheSingleGpuLayerCapturesAndReplaysBitwise) {
  MOEKIT_REQUIRE_SM90();
  const int n = GetParam();
  constexpr int kLayers = 2;
  const Inputs in(n);
  HostTensor ref_ids, ref_weights;
  {
    auto single = MoeLayer::create(layer_config(n * kMaxPerRank), in.weights(), Device::cuda(0));
    ASSERT_TRUE(single.ok()) << single.status().to_string();
    DeviceTensor hidden(in.hidden), logits(in.logits), out(DType::kBF16, {in.total, kH}),
        ids(DType::kI16, {n * kMaxPerRank, kK}), weights(DType::kF32, {n * kMaxPerRank, kK});
    ASSERT_TRUE((*single)->set_capture_target(ids.view(), weights.view()).ok());
    LayerForwardArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = out.view();
    ASSERT_TRUE((*single)->forward(a).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ref_ids = rows(ids.download(), 0, in.total);
    ref_weights = rows(weights.download(), 0, in.total);
  }
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& comm, cudaStream_t s) -> Status {
    const std::string rank = "rank " + std::to_string(r) + ": ";
    Model model;
    for (int l = 0; l < kLayers; ++l) {
      MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rank_config(n, r), in.weights(), comm));
      MOEKIT_RETURN_IF_ERROR(model.add_layer(std::move(layer), l));
    }
    MOEKIT_ASSIGN_OR_RETURN(auto cap, RoutedExpertsCapturer::create(kLayers, kMaxPerRank, kK, Device::cuda(0), true,
                                                                    CapturerOptions{true}));
    MOEKIT_RETURN_IF_ERROR(bind(model, *cap));
    const int64_t m = tokens_of(r);
    RankStep step(in, r);
    std::vector<DeviceTensor> outs, replayed;
    for (int l = 0; l < kLayers; ++l) {
      outs.emplace_back(DType::kBF16, std::vector<int64_t>{m, kH});
      replayed.emplace_back(DType::kBF16, std::vector<int64_t>{m, kH});
    }
    MOEKIT_RETURN_IF_ERROR(cap->add_request("r"));
    MOEKIT_RETURN_IF_ERROR(cap->begin_step({{{"r", m}}}, s));
    for (int l = 0; l < kLayers; ++l) {
      LayerForwardArgs a = step.args();
      a.out = outs[l].view();
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a, s));
    }
    MOEKIT_RETURN_IF_ERROR(cap->end_step(s));
    MOEKIT_ASSIGN_OR_RETURN(CaptureSet mine, cap->snapshot());
    const RequestCapture& got = mine.requests.at(0);
    if (got.num_tokens() != m) return DataLoss(rank + "captured " + std::to_string(got.num_tokens()) + " tokens");
    for (int64_t t = 0; t < m; ++t) {
      for (int l = 0; l < kLayers; ++l) {
        const int64_t at = (t * kLayers + l) * kK, ref = (in.first[r] + t) * kK;
        if (std::memcmp(got.ids.data<int16_t>() + at, ref_ids.data<int16_t>() + ref, kK * sizeof(int16_t)) != 0 ||
            std::memcmp(got.router_weights.data<float>() + at, ref_weights.data<float>() + ref, kK * sizeof(float))) {
          return DataLoss(rank + "token " + std::to_string(t) + " layer " + std::to_string(l) +
                          ": ids or router weights differ from the single-GPU layer's");
        }
      }
    }
    MOEKIT_ASSIGN_OR_RETURN(auto replayer, RoutedExpertsReplayer::create(std::move(mine), model));
    MOEKIT_RETURN_IF_ERROR(cap->add_request("again"));
    MOEKIT_RETURN_IF_ERROR(replayer->begin_step({{{"r", m}}}));
    MOEKIT_RETURN_IF_ERROR(cap->begin_step({{{"again", m}}}, s));
    for (int l = 0; l < kLayers; ++l) {
      replayed[l].poison();
      LayerForwardArgs a = step.args();
      a.out = replayed[l].view();
      a.forced_ids = replayer->forced_ids(l);
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a, s));
    }
    MOEKIT_RETURN_IF_ERROR(cap->end_step(s));
    for (int l = 0; l < kLayers; ++l) {
      const std::string diff = cuda_test::first_difference(replayed[l].download(), outs[l].download());
      if (!diff.empty()) return DataLoss(rank + "layer " + std::to_string(l) + ": replay differs: " + diff);
    }
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpLayerOneGpu, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return "ep" + std::to_string(p.param); });

// The sm90 modular kernel with custom ids: E 16, k 4, batch-invariant so that
// the extra GEMM rows of the comparison run cannot change other rows' bits.
struct SkipCase {
  static constexpr int64_t E = 16, k = 4, H = 128, I = 64, M = 24;
  MoeConfig config() const {
    MoeConfig c;
    c.num_experts = E;
    c.hidden = H;
    c.intermediate = I;
    c.max_num_tokens = M;
    c.quant.weight_dtype = c.quant.act_dtype = DType::kBF16;
    c.routing.method = RoutingMethod::kCustom;
    c.routing.top_k = static_cast<int>(k);
    c.batch_invariant = true;
    return c;
  }
};

StatusOr<std::unique_ptr<MoeKernel>> sm90_modular(const MoeConfig& c) {
  for (const KernelClass& kc : cuda::sm90_backend().candidates) {
    if (kc.name == "Sm90Modular") return kc.create(c, Platform::probe());
  }
  return NotFound("no Sm90Modular class");
}

TEST(SkipNegativeIds, ASkippedSlotAddsNothingAndARowOfSkipsIsZero) {
  MOEKIT_REQUIRE_SM90();
  SkipCase sc;
  const int64_t E = SkipCase::E, k = SkipCase::k, H = SkipCase::H, I = SkipCase::I, M = SkipCase::M;
  std::mt19937_64 rng(testing::seed_from({E, k, H, I, M, 77}));
  HostTensor w13 = testing::random_tensor(rng, DType::kBF16, {E, 2 * I, H}, 1.0 / std::sqrt(double(H)));
  HostTensor w2 = testing::random_tensor(rng, DType::kBF16, {E, H, I}, 1.0 / std::sqrt(double(I)));
  HostTensor hidden = testing::random_tensor(rng, DType::kBF16, {M, H}, 1.0);
  // Row t: experts (t + 3j) % E; slots j with (t + j) % 3 == 0 skipped; row 5 skips every slot.
  HostTensor skip_ids(DType::kI32, {M, k}), zero_ids(DType::kI32, {M, k}), weights(DType::kF32, {M, k}),
      zero_weights(DType::kF32, {M, k});
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = static_cast<int32_t>((t + 3 * j) % E);
      const bool skipped = t == 5 || (t + j) % 3 == 0;
      const float w = 0.25f + 0.125f * static_cast<float>(j);
      skip_ids.data<int32_t>()[t * k + j] = skipped ? -1 : e;
      zero_ids.data<int32_t>()[t * k + j] = e;
      weights.data<float>()[t * k + j] = w;
      zero_weights.data<float>()[t * k + j] = skipped ? 0.0f : w;
    }
  }
  ASSERT_CUDA_OK(cudaSetDevice(0));
  auto kernel = sm90_modular(sc.config());
  ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
  ASSERT_TRUE((*kernel)->prepare_weights(MoeWeights{w13.view(), w2.view(), {}}).ok());
  DeviceBytes ws((*kernel)->workspace_size(M));
  DeviceTensor d_hidden(hidden), d_skip(skip_ids), d_zero(zero_ids), d_w(weights), d_zw(zero_weights);
  DeviceTensor out_skip(DType::kBF16, {M, H}), out_zero(DType::kBF16, {M, H}), out_nan(DType::kBF16, {M, H});
  auto run = [&](const DeviceTensor& ids, const DeviceTensor& w, const DeviceTensor& out, bool skip) {
    MoeRunArgs a;
    a.hidden = d_hidden.view();
    a.out = out.view();
    a.topk_ids = ids.view();
    a.topk_weights = w.view();
    a.skip_negative_ids = skip;
    return (*kernel)->run(a, Workspace{ws.data(), ws.bytes()}, nullptr);
  };
  out_skip.poison();
  ASSERT_TRUE(run(d_skip, d_w, out_skip, true).ok());
  ASSERT_TRUE(run(d_zero, d_zw, out_zero, false).ok());
  ASSERT_TRUE(run(d_skip, d_w, out_nan, false).ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const HostTensor skipped = out_skip.download(), zeroed = out_zero.download(), poisoned = out_nan.download();
  EXPECT_EQ(cuda_test::first_difference(skipped, zeroed), "") << "a skipped slot must add exactly nothing";
  for (int64_t h = 0; h < H; ++h) {
    ASSERT_EQ(skipped.data<uint16_t>()[5 * H + h], 0) << "row 5 (every slot skipped) must be +0 at column " << h;
    ASSERT_TRUE(std::isnan(bf16_bits_to_f32(poisoned.data<uint16_t>()[0 * H + h])))
        << "without skip_negative_ids an id -1 keeps making its row NaN";
  }
}

}  // namespace
}  // namespace moekit
