// The replica table the GPU path reads (dispatch/ep_replica_table.h) picks the
// same physical slot as replica_for_token, for contiguous placements and EPLB
// plans, for every expert and many token keys.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dispatch/ep_replica_table.h"
#include "moekit/eplb.h"

namespace moekit {
namespace {

void expect_same_as_replica_for_token(const ExpertPlacement& p) {
  const std::vector<std::vector<int32_t>> replicas = p.replicas();
  StatusOr<dispatch::ReplicaTable> t = dispatch::make_replica_table(replicas);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->offsets.size(), static_cast<size_t>(p.num_logical + 1));
  const int32_t E = static_cast<int32_t>(p.num_logical);
  for (int32_t e = 0; e < E; ++e) {
    for (int64_t key = 0; key < 3 * p.num_ranks * 97; key += 7) {
      ASSERT_EQ(dispatch::replica_slot(t->offsets.data(), t->slots.data(), E, e, key),
                replica_for_token(replicas, e, key))
          << "expert " << e << ", key " << key << ", placement " << p.to_string();
    }
  }
  // An id the router marks invalid (-1) or out of range goes nowhere.
  EXPECT_EQ(dispatch::replica_slot(t->offsets.data(), t->slots.data(), E, -1, 5), -1);
  EXPECT_EQ(dispatch::replica_slot(t->offsets.data(), t->slots.data(), E, E, 5), -1);
}

TEST(EpReplicaTable, ContiguousPlacementsMatchTheHostRule) {
  for (int ranks : {1, 2, 3, 8}) {
    for (int64_t experts : {8, 16, 61}) {
      StatusOr<ExpertPlacement> p = ExpertPlacement::contiguous(experts, ranks);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      expect_same_as_replica_for_token(*p);
    }
  }
}

TEST(EpReplicaTable, EplbPlansWithReplicasMatchTheHostRule) {
  const int64_t E = 16;
  std::vector<int64_t> load(E);
  for (int64_t e = 0; e < E; ++e) load[e] = (e % 5 == 0) ? 1000 + 37 * e : 10 + e;  // a few hot experts
  for (int ranks : {2, 4}) {
    EplbOptions opt;
    opt.num_physical_slots = E + 2 * ranks;
    StatusOr<ExpertPlacement> p = plan_eplb(load, ranks, opt);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    expect_same_as_replica_for_token(*p);
  }
}

TEST(EpReplicaTable, AnExpertWithoutASlotIsNamed) {
  StatusOr<dispatch::ReplicaTable> t = dispatch::make_replica_table({{0}, {}, {2}});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("logical expert 1 has no physical slot"), std::string::npos)
      << t.status().message();
}

}  // namespace
}  // namespace moekit
