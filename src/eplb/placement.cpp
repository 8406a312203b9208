// ExpertPlacement: logical expert <-> physical slot, and the replica rule.
#include <sstream>

#include "moekit/eplb.h"

namespace moekit {

StatusOr<ExpertPlacement> ExpertPlacement::contiguous(int64_t num_logical, int num_ranks) {
  if (num_logical < 1) return InvalidArgument("placement: num_logical must be >= 1, got " + std::to_string(num_logical));
  if (num_ranks < 1) return InvalidArgument("placement: num_ranks must be >= 1, got " + std::to_string(num_ranks));
  if (num_ranks > num_logical) {
    return InvalidArgument("placement: " + std::to_string(num_ranks) + " ranks cannot share " +
                           std::to_string(num_logical) + " experts contiguously (a rank would hold none)");
  }
  ExpertPlacement p;
  p.num_logical = num_logical;
  p.num_ranks = num_ranks;
  p.slots_per_rank = (num_logical + num_ranks - 1) / num_ranks;
  p.physical_to_logical.assign(p.slots_per_rank * num_ranks, -1);
  for (int64_t e = 0; e < num_logical; ++e) p.physical_to_logical[e] = static_cast<int32_t>(e);
  return p;
}

Status ExpertPlacement::validate() const {
  if (num_logical < 1 || num_ranks < 1 || slots_per_rank < 1) {
    return InvalidArgument("placement: num_logical (" + std::to_string(num_logical) + "), num_ranks (" +
                           std::to_string(num_ranks) + ") and slots_per_rank (" + std::to_string(slots_per_rank) +
                           ") must all be >= 1");
  }
  if (num_slots() != slots_per_rank * num_ranks) {
    return InvalidArgument("placement: physical_to_logical has " + std::to_string(num_slots()) +
                           " slots; expected num_ranks * slots_per_rank = " + std::to_string(slots_per_rank * num_ranks));
  }
  std::vector<int> held(num_logical, 0);
  for (int64_t p = 0; p < num_slots(); ++p) {
    const int32_t e = physical_to_logical[p];
    if (e < -1 || e >= num_logical) {
      return OutOfRange("placement: slot " + std::to_string(p) + " holds expert " + std::to_string(e) +
                        ", not in [0, " + std::to_string(num_logical) + ") (or -1 for empty)");
    }
    if (e >= 0) ++held[e];
  }
  for (int64_t e = 0; e < num_logical; ++e) {
    if (held[e] == 0) {
      return InvalidArgument("placement: logical expert " + std::to_string(e) +
                             " is held by no slot; a placement must cover every logical expert");
    }
  }
  return Status::Ok();
}

std::vector<std::vector<int32_t>> ExpertPlacement::replicas() const {
  std::vector<std::vector<int32_t>> r(num_logical);
  for (int64_t p = 0; p < num_slots(); ++p) {
    const int32_t e = physical_to_logical[p];
    if (e >= 0 && e < num_logical) r[e].push_back(static_cast<int32_t>(p));
  }
  return r;
}

std::string ExpertPlacement::to_string() const {
  std::ostringstream os;
  for (int r = 0; r < num_ranks; ++r) {
    os << (r ? " " : "") << "rank " << r << ": [";
    for (int64_t s = 0; s < slots_per_rank; ++s) os << (s ? " " : "") << physical_to_logical[r * slots_per_rank + s];
    os << "]";
  }
  return os.str();
}

int32_t replica_for_token(const std::vector<std::vector<int32_t>>& replicas, int32_t logical, int64_t token_key) {
  const std::vector<int32_t>& r = replicas[logical];
  return r[static_cast<size_t>(token_key % static_cast<int64_t>(r.size()))];
}

std::vector<double> expected_rank_load(const ExpertPlacement& placement, const std::vector<int64_t>& load) {
  std::vector<double> out(placement.num_ranks, 0.0);
  const auto reps = placement.replicas();
  for (int64_t p = 0; p < placement.num_slots(); ++p) {
    const int32_t e = placement.physical_to_logical[p];
    if (e < 0 || e >= static_cast<int64_t>(load.size())) continue;
    out[placement.rank_of_slot(p)] += static_cast<double>(load[e]) / static_cast<double>(reps[e].size());
  }
  return out;
}

}  // namespace moekit
