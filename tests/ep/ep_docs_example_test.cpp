// docs/expert_parallel.md's "Using it" block, as written (the docs test checks
// that every line of it is a line here): N loopback ranks each run their own
// tokens through an ExpertParallelLayer, plan EPLB from the group's load,
// rebalance, and run again. Both forwards equal the single-rank layer over all
// ranks' tokens bit for bit (no shared expert: every path's rows are
// independent, ep_layer_test), so the documented program does what it says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "moekit/comm.h"
#include "moekit/ep_layer.h"
#include "moekit/eplb.h"
#include "moekit/layer.h"
#include "util/test_util.h"

namespace moekit {
namespace {

constexpr int64_t kE = 16, kH = 32, kI = 16, kTokens = 5;  // per rank

// One rank's tokens and the two outputs the block writes.
struct RankTokens {
  HostTensor hidden, logits, out, out_after;
  LayerForwardArgs args(HostTensor& into) const {
    LayerForwardArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = into.view();
    return a;
  }
};

TEST(EpDocsExample, TheDocumentedProgramRunsAndMatchesOneRank) {
  constexpr int N = 2;
  moekit::MoeConfig config;
  config.num_experts = kE;
  config.hidden = kH;
  config.intermediate = kI;
  config.max_num_tokens = kTokens;
  config.logits_dtype = DType::kF32;
  config.routing.method = RoutingMethod::kRenormalize;
  config.routing.top_k = 4;
  config.backend = "cpu";  // loopback ranks hold host memory
  std::mt19937_64 rng(testing::seed_from({N, 41}));
  const HostTensor w13 = testing::random_tensor(rng, DType::kBF16, {kE, 2 * kI, kH}, 1.0 / std::sqrt(double(kH)));
  const HostTensor w2 = testing::random_tensor(rng, DType::kBF16, {kE, kH, kI}, 1.0 / std::sqrt(double(kI)));
  const MoeWeights full_weights{w13.view(), w2.view(), {}};
  const HostTensor all_hidden = testing::random_tensor(rng, DType::kBF16, {N * kTokens, kH}, 1.0);
  const HostTensor all_logits = testing::tie_free_logits(rng, DType::kF32, N * kTokens, kE, 1.0 / 32.0);
  std::vector<RankTokens> tokens(N);
  for (int r = 0; r < N; ++r) {
    RankTokens& t = tokens[r];
    t.hidden = HostTensor(DType::kBF16, {kTokens, kH});
    t.logits = HostTensor(DType::kF32, {kTokens, kE});
    std::memcpy(t.hidden.data<uint16_t>(), all_hidden.data<uint16_t>() + r * kTokens * kH, t.hidden.nbytes());
    std::memcpy(t.logits.data<float>(), all_logits.data<float>() + r * kTokens * kE, t.logits.nbytes());
    t.out = t.out_after = HostTensor(DType::kBF16, {kTokens, kH});
    testing::poison(t.out);
    testing::poison(t.out_after);
  }
  std::vector<moekit::Status> status(N);

  // ---- the block of docs/expert_parallel.md
  // One thread per rank here (loopback); with NCCL, one process per GPU and
  // nccl_unique_id() / create_nccl_communicator(id, N, rank, Device::cuda(rank)).
  const moekit::CommUniqueId id = moekit::loopback_unique_id();  // made once, handed to every rank
  auto rank_main = [&](int rank) -> moekit::Status {
    MOEKIT_ASSIGN_OR_RETURN(auto comm, moekit::create_loopback_communicator(id, N, rank));
    moekit::MoeConfig c = config;                        // the same on every rank but for the rank fields
    c.parallel.ep_size = c.parallel.dp_size = N;
    c.parallel.ep_rank = c.parallel.dp_rank = rank;
    c.parallel.all2all = moekit::All2AllBackend::kAuto;  // the oracle picks, dispatch_reason() says why
    MOEKIT_ASSIGN_OR_RETURN(auto layer, moekit::ExpertParallelLayer::create(c, full_weights, *comm));
    MOEKIT_RETURN_IF_ERROR(layer->forward(tokens[rank].args(tokens[rank].out)));  // collective
    MOEKIT_ASSIGN_OR_RETURN(auto load, layer->gather_expert_load());
    moekit::EplbOptions opt;
    opt.num_physical_slots = c.num_experts + N;          // one redundant slot per rank
    MOEKIT_ASSIGN_OR_RETURN(auto plan, moekit::plan_eplb(load, N, opt));
    MOEKIT_RETURN_IF_ERROR(layer->rebalance(plan));      // moves weights; later forwards use replicas
    return layer->forward(tokens[rank].args(tokens[rank].out_after));
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < N; ++r) ranks.emplace_back([&, r] { status[r] = rank_main(r); });
  for (auto& t : ranks) t.join();
  // ---- end of the block

  for (int r = 0; r < N; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].to_string();
  MoeConfig single = config;
  single.max_num_tokens = N * kTokens;
  auto layer = MoeLayer::create(single, full_weights);
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  HostTensor all_out(DType::kBF16, {N * kTokens, kH});
  LayerForwardArgs a;
  a.hidden = all_hidden.view();
  a.router_logits = all_logits.view();
  a.out = all_out.view();
  ASSERT_TRUE((*layer)->forward(a).ok());
  for (int r = 0; r < N; ++r) {
    const size_t bytes = tokens[r].out.nbytes();
    const auto* want = all_out.data<uint16_t>() + r * kTokens * kH;
    EXPECT_EQ(std::memcmp(tokens[r].out.data<uint16_t>(), want, bytes), 0) << "rank " << r << " before EPLB";
    EXPECT_EQ(std::memcmp(tokens[r].out_after.data<uint16_t>(), want, bytes), 0) << "rank " << r << " after EPLB";
  }
}

}  // namespace
}  // namespace moekit
