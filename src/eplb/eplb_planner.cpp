// DeepSeek's expert-parallel load balancer for one layer, written from its
// public description: replicate the expert with the highest load per replica
// until the slots are full, then pack replicas onto ranks greedily (heaviest
// first, onto the lightest rank that still has room), hierarchically by node
// when the expert groups divide evenly over the nodes.
#include <algorithm>
#include <numeric>

#include "moekit/eplb.h"

namespace moekit {
namespace {

// Packs items into num_packs packs of exactly items.size() / num_packs items,
// heaviest item first onto the lightest pack with room (ties: lower index).
// Returns, per item, its pack and its position inside the pack.
struct Packing {
  std::vector<int> pack, position;
};
Packing balanced_packing(const std::vector<double>& weight, int num_packs) {
  const int n = static_cast<int>(weight.size());
  const int per_pack = n / num_packs;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
  std::vector<double> pack_weight(num_packs, 0.0);
  std::vector<int> pack_items(num_packs, 0);
  Packing out{std::vector<int>(n), std::vector<int>(n)};
  for (int item : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[p] == per_pack) continue;
      if (best < 0 || pack_weight[p] < pack_weight[best]) best = p;
    }
    out.pack[item] = best;
    out.position[item] = pack_items[best]++;
    pack_weight[best] += weight[item];
  }
  return out;
}

// Replicas for experts of weight `weight` into num_physical slots: one each,
// then each extra slot to the expert with the highest weight per replica.
// Returns the logical index (into weight) of every physical slot, and counts.
void replicate(const std::vector<double>& weight, int64_t num_physical, std::vector<int>* phys_to_log,
               std::vector<int>* count) {
  const int n = static_cast<int>(weight.size());
  phys_to_log->resize(num_physical);
  count->assign(n, 1);
  for (int i = 0; i < n; ++i) (*phys_to_log)[i] = i;
  for (int64_t i = n; i < num_physical; ++i) {
    int best = 0;
    for (int e = 1; e < n; ++e) {
      if (weight[e] / (*count)[e] > weight[best] / (*count)[best]) best = e;
    }
    (*phys_to_log)[i] = best;
    ++(*count)[best];
  }
}

}  // namespace

StatusOr<ExpertPlacement> plan_eplb(const std::vector<int64_t>& load, int num_ranks, const EplbOptions& options) {
  const int64_t E = static_cast<int64_t>(load.size());
  const int64_t P = options.num_physical_slots;
  if (E < 1) return InvalidArgument("eplb: load has no experts");
  if (num_ranks < 1) return InvalidArgument("eplb: num_ranks must be >= 1, got " + std::to_string(num_ranks));
  for (int64_t e = 0; e < E; ++e) {
    if (load[e] < 0) return InvalidArgument("eplb: load[" + std::to_string(e) + "] = " + std::to_string(load[e]) + " < 0");
  }
  if (P < E || P % num_ranks != 0) {
    return InvalidArgument("eplb: num_physical_slots (" + std::to_string(P) + ") must be >= num_logical (" +
                           std::to_string(E) + ") and a multiple of num_ranks (" + std::to_string(num_ranks) + ")");
  }
  if (options.num_nodes < 1 || num_ranks % options.num_nodes != 0) {
    return InvalidArgument("eplb: num_nodes (" + std::to_string(options.num_nodes) + ") must divide num_ranks (" +
                           std::to_string(num_ranks) + ")");
  }
  if (options.num_groups < 1 || E % options.num_groups != 0) {
    return InvalidArgument("eplb: num_groups (" + std::to_string(options.num_groups) + ") must divide num_logical (" +
                           std::to_string(E) + ")");
  }
  // Hierarchical when the groups spread evenly over the nodes; else global
  // (one node, one group), as the published policy does.
  const bool hierarchical = options.num_groups % options.num_nodes == 0;
  const int nodes = hierarchical ? options.num_nodes : 1;
  const int groups = hierarchical ? options.num_groups : 1;
  const int64_t group_size = E / groups;
  const int ranks_per_node = num_ranks / nodes;
  const int64_t slots_per_node = P / nodes, slots_per_rank = P / num_ranks;
  if (slots_per_node < E / nodes) {
    return InvalidArgument("eplb: " + std::to_string(slots_per_node) + " slots per node cannot hold the node's " +
                           std::to_string(E / nodes) + " experts");
  }

  // 1. Expert groups onto nodes, balanced by group load.
  std::vector<double> group_load(groups, 0.0);
  for (int64_t e = 0; e < E; ++e) group_load[e / group_size] += static_cast<double>(load[e]);
  const Packing group_pack = balanced_packing(group_load, nodes);
  std::vector<std::vector<int32_t>> node_experts(nodes, std::vector<int32_t>(E / nodes));
  for (int g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < group_size; ++i) {
      node_experts[group_pack.pack[g]][group_pack.position[g] * group_size + i] =
          static_cast<int32_t>(g * group_size + i);
    }
  }

  ExpertPlacement out;
  out.num_logical = E;
  out.num_ranks = num_ranks;
  out.slots_per_rank = slots_per_rank;
  out.physical_to_logical.assign(P, -1);
  for (int n = 0; n < nodes; ++n) {
    // 2. Replicas of the node's experts, into the node's slots.
    std::vector<double> w(node_experts[n].size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(load[node_experts[n][i]]);
    std::vector<int> phys_to_local, count;
    replicate(w, slots_per_node, &phys_to_local, &count);
    // 3. The node's replicas onto its ranks, balanced by load per replica.
    std::vector<double> replica_load(slots_per_node);
    for (int64_t i = 0; i < slots_per_node; ++i) replica_load[i] = w[phys_to_local[i]] / count[phys_to_local[i]];
    const Packing rank_pack = balanced_packing(replica_load, ranks_per_node);
    for (int64_t i = 0; i < slots_per_node; ++i) {
      const int64_t slot = n * slots_per_node + rank_pack.pack[i] * slots_per_rank + rank_pack.position[i];
      out.physical_to_logical[slot] = node_experts[n][phys_to_local[i]];
    }
  }
  MOEKIT_RETURN_IF_ERROR(out.validate());
  return out;
}

}  // namespace moekit
