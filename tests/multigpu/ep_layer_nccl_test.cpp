// ExpertParallelLayer on two GPUs over NCCL (one thread per rank, cuda:r),
// against the single-GPU layer (cuda:0) over the concatenated tokens, on a
// small DeepSeek-like shape (cuda/ep_gpu_test_util.h):
//   - captured ids identical (logical, spec order);
//   - outputs within the documented bound (docs/expert_parallel.md "GPU
//     numerics"): each rank's partial row is rounded to bf16 once;
//   - replay with the captured ids bitwise equal to the captured forward;
//   - the same with an EPLB placement (replicas of hot experts);
//   - a forward captured in a CUDA graph replays bitwise equal to eager;
//   - a rank with bad forced ids fails alone; the other rank's output is unchanged.
// Skips itself (reported as skipped) without NCCL, two GPUs, or sm_90.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/ep_gpu_test_util.h"
#include "multigpu/multigpu_test_util.h"

namespace moekit {
namespace {

using namespace ep_gpu_test;
using multigpu_test::run_gpu_ranks;

constexpr int kRanks = 2;

TEST(EpLayerNccl, EqualsTheSingleGpuLayerCapturesTheSameIdsAndReplaysBitwise) {
  MOEKIT_REQUIRE_GPUS(kRanks);
  MOEKIT_REQUIRE_SM90();
  const Inputs in(kRanks);
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
  const Inputs in(kRanks);
  const Reference ref = single_gpu(in);
  ASSERT_GT(ref.out.numel(), 0);
  StatusOr<ExpertPlacement> plan = eplb_placement(kRanks);
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
  const Inputs in(kRanks);
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rank_config(kRanks, r), in.weights(), c));
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
      if (!diff.empty()) {
        same = DataLoss("rank " + std::to_string(r) + " graph replay " + std::to_string(replay) + ": " + diff);
      }
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
  const Inputs in(kRanks);
  std::vector<HostTensor> first(kRanks);
  auto st = run_gpu_ranks(kRanks, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    // Batch-invariant: rank 1's experts then see fewer rows without changing any row's bits.
    MOEKIT_ASSIGN_OR_RETURN(
        auto layer, ExpertParallelLayer::create(rank_config(kRanks, r, /*batch_invariant=*/true), in.weights(), c));
    RankStep step(in, r);
    MOEKIT_RETURN_IF_ERROR(layer->forward(step.args(), s));
    CUDA_OK(cudaStreamSynchronize(s));
    first[r] = step.out.download();
    HostTensor bad(DType::kI32, {tokens_of(r), kK});
    for (int64_t i = 0; i < bad.numel(); ++i) bad.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
    bad.data<int32_t>()[0] = static_cast<int32_t>(kE);  // out of range, on rank 1 only
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
