// Expert placement and the EPLB planner: coverage, shapes, replication of hot
// experts, balance against the contiguous placement, the hierarchical policy,
// and bad plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "moekit/eplb.h"

namespace moekit {
namespace {

TEST(Placement, ContiguousHoldsEveryExpertOnce) {
  auto p = ExpertPlacement::contiguous(10, 3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->slots_per_rank, 4);
  EXPECT_EQ(p->to_string(), "rank 0: [0 1 2 3] rank 1: [4 5 6 7] rank 2: [8 9 -1 -1]");
  EXPECT_TRUE(p->validate().ok());
  EXPECT_FALSE(ExpertPlacement::contiguous(2, 3).ok());
}

TEST(Placement, APlanMissingALogicalExpertIsRejected) {
  auto p = ExpertPlacement::contiguous(4, 2);
  ASSERT_TRUE(p.ok());
  p->physical_to_logical = {0, 1, 1, 3};
  const Status s = p->validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("logical expert 2 is held by no slot"), std::string::npos) << s.message();
  p->physical_to_logical = {0, 1, 2, 4};
  EXPECT_EQ(p->validate().code(), StatusCode::kOutOfRange);
  p->physical_to_logical = {0, 1, 2};
  EXPECT_EQ(p->validate().code(), StatusCode::kInvalidArgument);
}

TEST(Placement, ReplicaForTokenIsAFunctionOfTheTokenAlone) {
  const std::vector<std::vector<int32_t>> reps = {{0, 5, 9}, {1}};
  EXPECT_EQ(replica_for_token(reps, 0, 0), 0);
  EXPECT_EQ(replica_for_token(reps, 0, 1), 5);
  EXPECT_EQ(replica_for_token(reps, 0, 5), 9);
  EXPECT_EQ(replica_for_token(reps, 1, 12345), 1);
}

double max_over_mean(const std::vector<double>& v) {
  double sum = 0, mx = 0;
  for (double x : v) sum += x, mx = std::max(mx, x);
  return mx / (sum / v.size());
}

TEST(EplbPlanner, ReplicatesHotExpertsAndBalancesRanks) {
  for (int ranks : {2, 4, 8}) {
    std::mt19937_64 rng(ranks);
    const int64_t E = 32;
    std::vector<int64_t> load(E);
    // Skewed: a few hot experts, the rest cold.
    for (int64_t e = 0; e < E; ++e) load[e] = (e % 7 == 0 ? 1000 : 10) + static_cast<int64_t>(rng() % 20);
    EplbOptions opt;
    opt.num_physical_slots = E + ranks * 2;
    auto plan = plan_eplb(load, ranks, opt);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_TRUE(plan->validate().ok());
    EXPECT_EQ(plan->slots_per_rank * ranks, opt.num_physical_slots);
    for (int32_t e : plan->physical_to_logical) EXPECT_GE(e, 0);  // every slot used
    const auto reps = plan->replicas();
    // Every extra slot went to a hot expert.
    for (int64_t e = 0; e < E; ++e) {
      if (load[e] < 100) EXPECT_EQ(reps[e].size(), 1u) << "cold expert " << e << " replicated";
    }
    auto base = ExpertPlacement::contiguous(E, ranks);
    ASSERT_TRUE(base.ok());
    const double before = max_over_mean(expected_rank_load(*base, load));
    const double after = max_over_mean(expected_rank_load(*plan, load));
    EXPECT_LT(after, before) << "ranks=" << ranks;
    EXPECT_LT(after, 1.25) << "ranks=" << ranks << " " << plan->to_string();
  }
}

TEST(EplbPlanner, HierarchicalKeepsEachGroupOnOneNode) {
  const int64_t E = 16;
  std::vector<int64_t> load(E);
  for (int64_t e = 0; e < E; ++e) load[e] = 1 + e * e;
  EplbOptions opt;
  opt.num_physical_slots = 24;
  opt.num_nodes = 2;
  opt.num_groups = 4;  // groups of 4 experts; 2 groups per node
  auto plan = plan_eplb(load, 4, opt);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const int64_t slots_per_node = 12;
  for (int64_t g = 0; g < 4; ++g) {
    int node = -1;
    for (int64_t p = 0; p < plan->num_slots(); ++p) {
      const int32_t e = plan->physical_to_logical[p];
      if (e / 4 != g) continue;
      const int n = static_cast<int>(p / slots_per_node);
      if (node < 0) node = n;
      EXPECT_EQ(n, node) << "group " << g << " split over nodes: " << plan->to_string();
    }
  }
  // The two heaviest groups (2 and 3) land on different nodes.
  auto node_of = [&](int32_t e) {
    for (int64_t p = 0; p < plan->num_slots(); ++p) {
      if (plan->physical_to_logical[p] == e) return static_cast<int>(p / slots_per_node);
    }
    return -1;
  };
  EXPECT_NE(node_of(8), node_of(12));
}

TEST(EplbPlanner, IsDeterministic) {
  std::vector<int64_t> load = {5, 5, 5, 5, 9, 9, 1, 1};
  EplbOptions opt;
  opt.num_physical_slots = 12;
  auto a = plan_eplb(load, 2, opt), b = plan_eplb(load, 2, opt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->physical_to_logical, b->physical_to_logical);
}

TEST(EplbPlanner, BadOptionsAreNamed) {
  std::vector<int64_t> load(8, 1);
  EplbOptions opt;
  opt.num_physical_slots = 7;
  EXPECT_NE(plan_eplb(load, 2, opt).status().message().find("num_physical_slots (7)"), std::string::npos);
  opt.num_physical_slots = 9;
  EXPECT_NE(plan_eplb(load, 2, opt).status().message().find("multiple of num_ranks"), std::string::npos);
  opt.num_physical_slots = 8;
  opt.num_nodes = 3;
  EXPECT_NE(plan_eplb(load, 2, opt).status().message().find("num_nodes (3) must divide"), std::string::npos);
  load[3] = -1;
  opt.num_nodes = 1;
  EXPECT_NE(plan_eplb(load, 2, opt).status().message().find("load[3] = -1"), std::string::npos);
}

}  // namespace
}  // namespace moekit
