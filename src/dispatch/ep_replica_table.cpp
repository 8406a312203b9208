#include "dispatch/ep_replica_table.h"

#include <string>

namespace moekit::dispatch {

StatusOr<ReplicaTable> make_replica_table(const std::vector<std::vector<int32_t>>& replicas) {
  ReplicaTable t;
  t.offsets.reserve(replicas.size() + 1);
  t.offsets.push_back(0);
  for (size_t e = 0; e < replicas.size(); ++e) {
    if (replicas[e].empty()) {
      return InvalidArgument("replica table: logical expert " + std::to_string(e) + " has no physical slot");
    }
    t.slots.insert(t.slots.end(), replicas[e].begin(), replicas[e].end());
    t.offsets.push_back(static_cast<int32_t>(t.slots.size()));
  }
  return t;
}

}  // namespace moekit::dispatch
