#include "dispatch/ep_pair_rows.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dispatch/host_all_gather.h"

namespace moekit::dispatch {

int64_t EpShape::max_pairs(int ranks) const { return ranks * max_tokens * std::min(top_k, slots_per_rank); }

Status check_ep_shape(const Communicator& comm, const EpShape& s) {
  if (s.max_tokens < 1 || s.hidden < 1 || s.top_k < 1 || s.slots_per_rank < 1) {
    return InvalidArgument("expert parallel: max_tokens, hidden, top_k and slots_per_rank must be >= 1");
  }
  if (s.act_dtype != DType::kF32 && s.act_dtype != DType::kBF16) {
    return InvalidArgument(std::string("expert parallel: activations must be f32 or bf16, got ") + dtype_name(s.act_dtype));
  }
  // Row indices into the return buffers are i32 (as the experts stage's permutation).
  const int64_t limit = std::numeric_limits<int32_t>::max();
  if (s.max_pairs(comm.size()) > limit || comm.size() * s.max_tokens * s.top_k > limit) {
    return InvalidArgument("expert parallel: " + std::to_string(comm.size()) + " ranks x max_num_tokens " +
                           std::to_string(s.max_tokens) + " x top_k " + std::to_string(s.top_k) +
                           " pairs do not fit the i32 row indices");
  }
  return Status::Ok();
}

Status check_physical_ids(const int32_t* ids, int64_t M, int64_t k, const ExpertPlacement& placement) {
  for (int64_t i = 0; i < M * k; ++i) {
    const int32_t slot = ids[i];
    if (slot < 0 || slot >= placement.num_slots() || placement.physical_to_logical[slot] < 0) {
      return OutOfRange("expert parallel: token " + std::to_string(i / k) + " slot " + std::to_string(i % k) +
                        " asks for physical expert " + std::to_string(slot) +
                        (slot >= 0 && slot < placement.num_slots()
                             ? ", an empty slot of rank " + std::to_string(placement.rank_of_slot(slot)) +
                                   " (no expert there)"
                             : ", not in [0, " + std::to_string(placement.num_slots()) + ")"));
    }
  }
  return Status::Ok();
}

size_t dispatch_row_bytes(const EpShape& s) {
  return s.top_k * sizeof(int32_t) + s.hidden * dtype_size(s.act_dtype);
}

int64_t unpack_dispatch_row(const char* row, const EpShape& s, int64_t next, float* x_pairs, int32_t* pair_slot) {
  const int32_t* want = reinterpret_cast<const int32_t*>(row);
  const char* act = row + s.top_k * sizeof(int32_t);
  for (int64_t j = 0; j < s.top_k; ++j) {
    if (want[j] < 0) continue;
    float* x = x_pairs + next * s.hidden;
    if (s.act_dtype == DType::kF32) {
      std::memcpy(x, act, s.hidden * sizeof(float));
    } else {
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(act);  // bf16
      for (int64_t c = 0; c < s.hidden; ++c) x[c] = bf16_bits_to_f32(bits[c]);
    }
    pair_slot[next++] = want[j];
  }
  return next;
}

Status agree(Communicator& comm, const Status& local) {
  const int32_t mine = static_cast<int32_t>(local.code());
  std::vector<int32_t> all(comm.size());
  MOEKIT_RETURN_IF_ERROR(all_gather_host(comm, &mine, all.data(), sizeof(int32_t)));
  if (!local.ok()) return local;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[r] != 0) {
      return Status(static_cast<StatusCode>(all[r]), "expert parallel: rank " + std::to_string(r) +
                                                         " rejected its input (its error names the problem); "
                                                         "nothing ran on any rank");
    }
  }
  return Status::Ok();
}

}  // namespace moekit::dispatch
