// What the GPU expert-parallel tests share (test_ep_layer_cuda on one GPU over
// device-loopback ranks, ep_layer_nccl_test on two GPUs over NCCL): a small
// DeepSeek-like layer (deepseek_v3 routing with groups and a bias), each
// rank's tokens, the single-GPU layer over all of them as the reference, and
// the capture -> replay sequence of one rank.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "moekit/comm.h"
#include "moekit/ep_layer.h"
#include "moekit/eplb.h"
#include "moekit/layer.h"
#include "util/test_util.h"

namespace moekit::ep_gpu_test {

inline constexpr int64_t kE = 64, kH = 256, kI = 128, kMaxPerRank = 96;
inline constexpr int kK = 6;
inline int64_t tokens_of(int rank) {
  constexpr int64_t kTokens[] = {80, 53, 17, 96};  // uneven
  return kTokens[rank % 4];
}

// ||out_ep - out_1|| / ||out_1|| for N ranks (docs/expert_parallel.md "GPU
// numerics"): elementwise 2^-8 (sum_r |P_r| + 2 |S|) with P_r a rank's
// partial; with partials of the output's size, at most (N + 2) 2^-8.
inline double ep_bound(int ranks) { return (ranks + 2) / 256.0; }

inline MoeConfig layer_config(int64_t max_tokens) {
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

inline MoeConfig rank_config(int ranks, int r, bool batch_invariant = false) {
  MoeConfig c = layer_config(kMaxPerRank);
  c.batch_invariant = batch_invariant;
  c.parallel.ep_size = c.parallel.dp_size = ranks;
  c.parallel.ep_rank = c.parallel.dp_rank = r;
  c.parallel.all2all = All2AllBackend::kNccl;
  return c;
}

// The group's tokens (rank 0's rows first) and the layer's weights, on the host.
struct Inputs {
  int ranks = 0;
  std::vector<int64_t> first;  // [N + 1] row offsets
  int64_t total = 0;
  HostTensor w13, w2, bias, hidden, logits;
  explicit Inputs(int n) : ranks(n) {
    first.push_back(0);
    for (int r = 0; r < n; ++r) first.push_back(first.back() + tokens_of(r));
    total = first.back();
    std::mt19937_64 rng(testing::seed_from({n, kE, kK, kH, kI, 611}));
    w13 = testing::random_tensor(rng, DType::kBF16, {kE, 2 * kI, kH}, 1.0 / std::sqrt(double(kH)));
    w2 = testing::random_tensor(rng, DType::kBF16, {kE, kH, kI}, 1.0 / std::sqrt(double(kI)));
    bias = testing::random_tensor(rng, DType::kF32, {kE}, 0.1);
    hidden = testing::random_tensor(rng, DType::kBF16, {total, kH}, 1.0);
    logits = testing::tie_free_logits(rng, DType::kF32, total, kE, 1e-3);
  }
  MoeWeights weights() const { return MoeWeights{w13.view(), w2.view(), bias.view()}; }
};

inline HostTensor rows(const HostTensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = t.nbytes() / shape[0];
  shape[0] = end - begin;
  HostTensor out(t.dtype(), shape);
  if (end > begin) std::memcpy(out.data<char>(), t.data<char>() + begin * row_bytes, (end - begin) * row_bytes);
  return out;
}

inline HostTensor ids_as_i32(const HostTensor& i16, int64_t m) {
  HostTensor out(DType::kI32, {m, kK});
  for (int64_t i = 0; i < m * kK; ++i) out.data<int32_t>()[i] = i16.data<int16_t>()[i];
  return out;
}

// The single-GPU layer (cuda:0) over every token: out [total, H] bf16, ids [total, k] i16.
struct Reference {
  HostTensor out, ids;
};

// The same for any layer: config (one GPU, max_num_tokens >= the tokens),
// weights, and every token's hidden [total, H] and logits.
inline Reference single_gpu(const MoeConfig& config, const MoeWeights& weights, const HostTensor& group_hidden,
                            const HostTensor& group_logits) {
  Reference ref;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  auto layer = MoeLayer::create(config, weights, Device::cuda(0));
  EXPECT_TRUE(layer.ok()) << layer.status().to_string();
  if (!layer.ok()) return ref;
  const int64_t total = group_hidden.shape()[0];
  cuda_test::DeviceTensor hidden(group_hidden), logits(group_logits), out(DType::kBF16, {total, kH}),
      ids(DType::kI16, {total, kK});
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

inline Reference single_gpu(const Inputs& in) {
  return single_gpu(layer_config(in.ranks * kMaxPerRank), in.weights(), in.hidden, in.logits);
}

// This rank's tokens on the current device and the views of one forward.
struct RankStep {
  cuda_test::DeviceTensor hidden, logits, out, ids;
  // The rows [begin, end) of the group's hidden [total, H] and logits.
  RankStep(const HostTensor& group_hidden, const HostTensor& group_logits, int64_t begin, int64_t end)
      : hidden(rows(group_hidden, begin, end)),
        logits(rows(group_logits, begin, end)),
        out(DType::kBF16, {end - begin, group_hidden.shape()[1]}),
        ids(DType::kI16, {kMaxPerRank, kK}) {}
  RankStep(const Inputs& in, int r) : RankStep(in.hidden, in.logits, in.first[r], in.first[r + 1]) {}
  LayerForwardArgs args() const {
    LayerForwardArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = out.view();
    return a;
  }
};

struct RankResult {
  HostTensor out, ids;
};

// Rank r's EP layer (config: the rank's, weights: the whole layer's) on its
// step: a forward capturing the ids, then a replay with them, bitwise the same output.
inline Status capture_then_replay(int r, Communicator& comm, cudaStream_t s, const MoeConfig& config,
                                  const MoeWeights& weights, RankStep& step, const ExpertPlacement* placement,
                                  RankResult* result) {
  MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(config, weights, comm, placement));
  if (std::string(layer->dispatch_name()) != "all_to_all") return Internal("dispatch: " + layer->dispatch_reason());
  step.out.poison();
  LayerForwardArgs a = step.args();
  a.routing_replay_out = step.ids.view();
  MOEKIT_RETURN_IF_ERROR(layer->forward(a, s));
  if (cudaStreamSynchronize(s) != cudaSuccess) return Internal("rank " + std::to_string(r) + ": forward failed");
  result->out = step.out.download();
  result->ids = step.ids.download();

  const HostTensor forced = ids_as_i32(result->ids, step.hidden.view().dim(0));
  step.out.poison();
  LayerForwardArgs replay = step.args();
  replay.forced_ids = forced.view();
  MOEKIT_RETURN_IF_ERROR(layer->forward(replay, s));
  if (cudaStreamSynchronize(s) != cudaSuccess) return Internal("rank " + std::to_string(r) + ": replay failed");
  const std::string diff = cuda_test::first_difference(step.out.download(), result->out);
  if (!diff.empty()) return DataLoss("rank " + std::to_string(r) + ": replay differs from the capture: " + diff);
  return Status::Ok();
}

inline Status capture_then_replay(int r, Communicator& comm, cudaStream_t s, const Inputs& in,
                                  const ExpertPlacement* placement, RankResult* result) {
  RankStep step(in, r);
  return capture_then_replay(r, comm, s, rank_config(in.ranks, r), in.weights(), step, placement, result);
}

// Ids identical to the single-GPU layer's, outputs within ep_bound.
inline void expect_equals_single_gpu(const Inputs& in, const std::vector<RankResult>& ep, const Reference& ref) {
  std::vector<double> out_ep;
  const std::vector<double> out_ref = testing::to_double(ref.out.view());
  for (int r = 0; r < in.ranks; ++r) {
    const int64_t m = tokens_of(r);
    const std::vector<double> o = testing::to_double(ep[r].out.view());
    out_ep.insert(out_ep.end(), o.begin(), o.end());
    for (int64_t i = 0; i < m * kK; ++i) {
      ASSERT_EQ(ep[r].ids.data<int16_t>()[i], ref.ids.data<int16_t>()[in.first[r] * kK + i])
          << "rank " << r << " token " << i / kK << " slot " << i % kK;
    }
  }
  ASSERT_EQ(out_ep.size(), static_cast<size_t>(in.total * kH));
  const double err = testing::rel_l2_error(out_ep, out_ref);
  EXPECT_LE(err, ep_bound(in.ranks)) << "EP output vs the single-GPU layer (normalized), " << in.ranks << " ranks";
  ::testing::Test::RecordProperty("ep_vs_single_gpu_rel_l2_" + std::to_string(in.ranks), std::to_string(err));
}

// A placement from EPLB with about two redundant slots per rank (a few hot
// experts get replicas: every hot_every-th).
inline StatusOr<ExpertPlacement> eplb_placement(int ranks, int hot_every = 7) {
  std::vector<int64_t> load(kE);
  for (int64_t e = 0; e < kE; ++e) load[e] = e % hot_every == 0 ? 500 + e : 10 + e;
  EplbOptions opt;
  opt.num_physical_slots = (kE + 2 * ranks + ranks - 1) / ranks * ranks;  // a multiple of the ranks
  return plan_eplb(load, ranks, opt);
}

}  // namespace moekit::ep_gpu_test
