// ExpertParallelLayer on two GPUs over NCCL (one thread per rank, cuda:r),
// against the single-GPU layer (cuda:0) over the concatenated tokens, on a
// small DeepSeek-like shape (deepseek_v3 routing with groups and a bias):
//   - captured ids identical (logical, spec order);
//   - outputs within the documented bound (docs/expert_parallel.md "GPU
//     numerics"): each rank's partial row is rounded to bf16 once;
//   - replay with the captured ids bitwise equal to the captured forward;
//   - the same with an EPLB placement (replicas of hot experts);
//   - a forward captured in a CUDA graph replays bitwise equal to eager;
//   - a rank with bad forced ids fails alone; the other rank's output is unchanged.
// Skips itself (reported as skipped) without NCCL or with fewer than two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "moekit/ep_layer.h"
#include "moekit/eplb.h"
#include "moekit/layer.h"
#include "multigpu/multigpu_test_util.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using cuda_test::DeviceTensor;
using multigpu_test::run_gpu_ranks;

constexpr int kRanks = 2;
constexpr int64_t kE = 64, kH = 256, kI = 128, kMaxPerRank = 96;
constexpr int kK = 6;
int64_t tokens_of(int rank) { return rank == 0 ? 80 : 53; }  // uneven

// ||out_ep - out_1|| / ||out_1||: the elementwise bound of the doc is
// 2^-8 (sum_r |P_r| + 2 |S|) with P_r a rank's partial; with N ranks and
// partials of the output's size that is at most (N + 2) 2^-8.
constexpr double kEpBound = (kRanks + 2) / 256.0;

MoeConfig layer_config(int64_t max_tokens) {
  MoeConfig c;
  c.num_experts = kE;
  c.hidden = kH;
  c.intermediate = kI;
  c.max_num_tokens = max_tokens;
  c.logits_dtype = DType::kF32;
  c.quant.weight_dtype = DType::kBF16;
  c.quant.act_dtype = DType::kBF16;
  c.routing.method = RoutingMethod::kDeepseekV3;
  c.routing.top_k = kK;
  c.routing.num_groups = 8;
  c.routing.topk_groups = 4;
  c.routing.routed_scaling_factor = 2.5f;
  c.routing.has_score_bias = true;
  return c;
}

MoeConfig rank_config(int r, bool batch_invariant = false) {
  MoeConfig c = layer_config(kMaxPerRank);
  c.batch_invariant = batch_invariant;
  c.parallel.ep_size = c.parallel.dp_size = kRanks;
  c.parallel.ep_rank = c.parallel.dp_rank = r;
  c.parallel.all2all = All2AllBackend::kNccl;
  return c;
}

// The group's tokens (rank 0's rows first) and the layer's weights, on the host.
struct Inputs {
  std::vector<int64_t> first;  // [N + 1] row offsets
  int64_t total = 0;
  HostTensor w13, w2, bias, hidden, logits;
  Inputs() {
    first.push_back(0);
    for (int r = 0; r < kRanks; ++r) first.push_back(first.back() + tokens_of(r));
    total = first.back();
    std::mt19937_64 rng(20240611);
    w13 = testing::random_tensor(rng, DType::kBF16, {kE, 2 * kI, kH}, 1.0 / std::sqrt(double(kH)));
    w2 = testing::random_tensor(rng, DType::kBF16, {kE, kH, kI}, 1.0 / std::sqrt(double(kI)));
    bias = testing::random_tensor(rng, DType::kF32, {kE}, 0.1);
    hidden = testing::random_tensor(rng, DType::kBF16, {total, kH}, 1.0);
    logits = testing::tie_free_logits(rng, DType::kF32, total, kE, 1e-3);
  }
  MoeWeights weights() const {
    MoeWeights w{w13.view(), w2.view(), bias.view()};
    return w;
  }
};

HostTensor rows(const HostTensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = t.nbytes() / shape[0];
  shape[0] = end - begin;
  HostTensor out(t.dtype(), shape);
  std::memcpy(out.data<char>(), t.data<char>() + begin * row_bytes, (end - begin) * row_bytes);
  return out;
}

HostTensor ids_as_i32(const HostTensor& i16, int64_t m) {
  HostTensor out(DType::kI32, {m, kK});
  for (int64_t i = 0; i < m * kK; ++i) out.data<int32_t>()[i] = i16.data<int16_t>()[i];
  return out;
}

// The single-GPU layer over every token: out [total, H] bf16 and ids [total, k] i16.
struct Reference {
  HostTensor out, ids;
};

Reference single_gpu(const Inputs& in) {
  Reference ref;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  auto layer = MoeLayer::create(layer_config(kRanks * kMaxPerRank), in.weights(), Device::cuda(0));
  EXPECT_TRUE(layer.ok()) << layer.status().to_string();
  if (!layer.ok()) return ref;
  DeviceTensor hidden(in.hidden), logits(in.logits), out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  LayerForwardArgs a;
  a.hidden = hidden.view();
  a.router_logits = logits.view();
  a.out = out.view();
  a.routing_replay_out = ids.view();
  const Status st = (*layer)->forward(a);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ref.out = out.download();
  ref.ids = ids.download();
  return ref;
}

// One rank's results of the EP layer.
struct RankResult {
  HostTensor out, ids;
};

// This rank's tokens on the device and the views of one forward.
struct RankStep {
  DeviceTensor hidden, logits, out, ids;
  RankStep(const Inputs& in, int r)
      : hidden(rows(in.hidden, in.first[r], in.first[r + 1])),
        logits(rows(in.logits, in.first[r], in.first[r + 1])),
        out(DType::kBF16, {tokens_of(r), kH}),
        ids(DType::kI16, {kMaxPerRank, kK}) {}
  LayerForwardArgs args() const {
    LayerForwardArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = out.view();
    return a;
  }
};

// Forward (capturing ids), then replay with those ids: bitwise the same output.
Status capture_then_replay(int r, Communicator& comm, cudaStream_t s, const Inputs& in,
                           const ExpertPlacement* placement, RankResult* result) {
  MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rank_config(r), in.weights(), comm, placement));
  if (std::string(layer->dispatch_name()) != "all_to_all") return Internal("dispatch: " + layer->dispatch_reason());
  RankStep step(in, r);
  step.out.poison();
  LayerForwardArgs a = step.args();
  a.routing_replay_out = step.ids.view();
  MOEKIT_RETURN_IF_ERROR(layer->forward(a, s));
  CUDA_OK(cudaStreamSynchronize(s));
  result->out = step.out.download();
  result->ids = step.ids.download();

  const HostTensor forced = ids_as_i32(result->ids, tokens_of(r));
  step.out.poison();
  LayerForwardArgs replay = step.args();
  replay.forced_ids = forced.view();
  MOEKIT_RETURN_IF_ERROR(layer->forward(replay, s));
  CUDA_OK(cudaStreamSynchronize(s));
  const std::string diff = cuda_test::first_difference(step.out.download(), result->out);
  if (!diff.empty()) return DataLoss("rank " + std::to_string(r) + ": replay differs from the capture: " + diff);
  return Status::Ok();
}

void expect_equals_single_gpu(const Inputs& in, const std::vector<RankResult>& ep, const Reference& ref) {
  const int64_t H = kH;
  std::vector<double> out_ep, out_ref = testing::to_double(ref.out.view());
  for (int r = 0; r < kRanks; ++r) {
    const int64_t m = tokens_of(r);
    const std::vector<double> o = testing::to_double(ep[r].out.view());
    out_ep.insert(out_ep.end(), o.begin(), o.end());
    for (int64_t i = 0; i < m * kK; ++i) {
      ASSERT_EQ(ep[r].ids.data<int16_t>()[i], ref.ids.data<int16_t>()[in.first[r] * kK + i])
          << "rank " << r << " token " << i / kK << " slot " << i % kK;
    }
  }
  ASSERT_EQ(out_ep.size(), static_cast<size_t>(in.total * H));
  const double err = testing::rel_l2_error(out_ep, out_ref);
  EXPECT_LE(err, kEpBound) << "EP output vs the single-GPU layer (normalized)";
  ::testing::Test::RecordProperty("ep_vs_single_gpu_rel_l2", std::to_string(err));
}

TEST(EpLayerNccl, EqualsTheSingleGpuLayerCapturesTheSameIdsAndReplaysBitwise) {
  MOEKIT_REQUIRE_GPUS(kRanks);
  MOEKIT_REQUIRE_SM90();
  const Inputs in;
  const Reference ref = single_gpu(in);
  ASSERT_GT(ref.out.numel(), 0);
  std::vector<RankResult> ep(kRanks);
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) {
    return capture_then_replay(r, c, s, in, nullptr, &ep[r]);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  expect_equals_single_gpu(in, ep, ref);
}

TEST(EpLayerNccl, WithEplbReplicasTheSameHolds) {
  MOEKIT_REQUIRE_GPUS(kRanks);
  MOEKIT_REQUIRE_SM90();
  const Inputs in;
  const Reference ref = single_gpu(in);
  ASSERT_GT(ref.out.numel(), 0);
  std::vector<int64_t> load(kE);
  for (int64_t e = 0; e < kE; ++e) load[e] = e % 7 == 0 ? 500 + e : 10 + e;  // a few hot experts get replicas
  EplbOptions opt;
  opt.num_physical_slots = kE + 2 * kRanks;
  StatusOr<ExpertPlacement> plan = plan_eplb(load, kRanks, opt);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::vector<RankResult> ep(kRanks);
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) {
    return capture_then_replay(r, c, s, in, &*plan, &ep[r]);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  expect_equals_single_gpu(in, ep, ref);
}

TEST(EpLayerNccl, AForwardCapturedInACudaGraphReplaysEqualToEager) {
  MOEKIT_REQUIRE_GPUS(kRanks);
  MOEKIT_REQUIRE_SM90();
  const Inputs in;
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rank_config(r), in.weights(), c));
    RankStep step(in, r);
    MOEKIT_RETURN_IF_ERROR(layer->forward(step.args(), s));
    CUDA_OK(cudaStreamSynchronize(s));
    const HostTensor eager = step.out.download();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const Status captured = layer->forward(step.args(), s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    MOEKIT_RETURN_IF_ERROR(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    Status same = Status::Ok();
    for (int replay = 0; replay < 3 && same.ok(); ++replay) {
      step.out.poison();
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      const std::string diff = cuda_test::first_difference(step.out.download(), eager);
      if (!diff.empty()) same = DataLoss("rank " + std::to_string(r) + " graph replay " + std::to_string(replay) + ": " + diff);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return same;
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(EpLayerNccl, ARankWithBadForcedIdsFailsAloneAndTheOtherRankIsUnchanged) {
  MOEKIT_REQUIRE_GPUS(kRanks);
  MOEKIT_REQUIRE_SM90();
  const Inputs in;
  std::vector<HostTensor> first(kRanks);
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    // Batch-invariant: rank 1's experts then see fewer rows without changing any row's bits.
    MOEKIT_ASSIGN_OR_RETURN(auto layer,
                            ExpertParallelLayer::create(rank_config(r, /*batch_invariant=*/true), in.weights(), c));
    RankStep step(in, r);
    MOEKIT_RETURN_IF_ERROR(layer->forward(step.args(), s));
    CUDA_OK(cudaStreamSynchronize(s));
    first[r] = step.out.download();
    HostTensor bad(DType::kI32, {tokens_of(r), kK});
    for (int64_t i = 0; i < bad.numel(); ++i) bad.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
    bad.data<int32_t>()[0] = static_cast<int32_t>(kE);  // out of range on rank 1 only
    LayerForwardArgs a = step.args();
    if (r == 1) a.forced_ids = bad.view();
    const Status fwd = layer->forward(a, s);
    CUDA_OK(cudaStreamSynchronize(s));
    if (r == 1) {
      if (fwd.ok()) return Internal("rank 1: bad forced ids were accepted");
      if (fwd.message().find("forced_ids") == std::string::npos) return Internal("rank 1: " + fwd.to_string());
      return Status::Ok();
    }
    MOEKIT_RETURN_IF_ERROR(fwd);
    const std::string diff = cuda_test::first_difference(step.out.download(), first[r]);
    if (!diff.empty()) return DataLoss("rank 0's output changed: " + diff);
    return Status::Ok();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace moekit
