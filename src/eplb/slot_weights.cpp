#include "eplb/slot_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace moekit::eplb {

TensorView SlotWeights::w13_view() const {
  return TensorView::contiguous(const_cast<char*>(w13.data()), dtype, {slots, n1, hidden});
}
TensorView SlotWeights::w2_view() const {
  return TensorView::contiguous(const_cast<char*>(w2.data()), dtype, {slots, hidden, intermediate});
}

namespace {
SlotWeights empty_slots(DType dtype, int64_t slots, int64_t n1, int64_t H, int64_t I) {
  SlotWeights w;
  w.dtype = dtype;
  w.slots = slots;
  w.n1 = n1;
  w.hidden = H;
  w.intermediate = I;
  w.w13.assign(slots * w.w13_bytes(), 0);
  w.w2.assign(slots * w.w2_bytes(), 0);
  return w;
}
}  // namespace

StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& p, int rank,
                                                DType dtype, int64_t n1, int64_t H, int64_t I) {
  MOEKIT_RETURN_IF_ERROR(check_tensor(logical.w13, "w13", {dtype}, {p.num_logical, n1, H}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(logical.w2, "w2", {dtype}, {p.num_logical, H, I}, Device::cpu()));
  SlotWeights w = empty_slots(dtype, p.slots_per_rank, n1, H, I);
  for (int64_t s = 0; s < p.slots_per_rank; ++s) {
    const int32_t e = p.physical_to_logical[rank * p.slots_per_rank + s];
    if (e < 0) continue;
    std::memcpy(w.w13.data() + s * w.w13_bytes(), logical.w13.ptr<const char>() + e * w.w13_bytes(), w.w13_bytes());
    std::memcpy(w.w2.data() + s * w.w2_bytes(), logical.w2.ptr<const char>() + e * w.w2_bytes(), w.w2_bytes());
  }
  return w;
}

StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& p, int rank,
                                              DType dtype, int64_t n1, int64_t H, int64_t I) {
  const int64_t S = p.slots_per_rank;
  MOEKIT_RETURN_IF_ERROR(check_tensor(local.w13, "w13 (this rank's slots)", {dtype}, {S, n1, H}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(local.w2, "w2 (this rank's slots)", {dtype}, {S, H, I}, Device::cpu()));
  SlotWeights w = empty_slots(dtype, S, n1, H, I);
  for (int64_t s = 0; s < S; ++s) {
    if (p.physical_to_logical[rank * S + s] < 0) continue;
    std::memcpy(w.w13.data() + s * w.w13_bytes(), local.w13.ptr<const char>() + s * w.w13_bytes(), w.w13_bytes());
    std::memcpy(w.w2.data() + s * w.w2_bytes(), local.w2.ptr<const char>() + s * w.w2_bytes(), w.w2_bytes());
  }
  return w;
}

StatusOr<SlotWeights> move_slot_weights(Communicator& comm, const SlotWeights& mine, const ExpertPlacement& current,
                                        const ExpertPlacement& next) {
  const int n = comm.size(), me = comm.rank();
  // The rank that serves each logical expert: its lowest holder now.
  std::vector<int> owner(current.num_logical, -1);
  std::vector<int64_t> owner_slot(current.num_logical, -1);  // local slot on that rank
  for (int64_t p = current.num_slots() - 1; p >= 0; --p) {
    const int32_t e = current.physical_to_logical[p];
    if (e < 0) continue;
    owner[e] = current.rank_of_slot(p);
    owner_slot[e] = p % current.slots_per_rank;
  }
  SlotWeights out = empty_slots(mine.dtype, next.slots_per_rank, mine.n1, mine.hidden, mine.intermediate);
  const size_t a = mine.w13_bytes(), b = mine.w2_bytes(), row = a + b;
  const int64_t max_rows = next.slots_per_rank;
  std::vector<char> send(n * max_rows * row), recv(n * max_rows * row);
  std::vector<int32_t> send_counts(n, 0), recv_counts(n, 0);
  // Rows to rank d: the experts of d's new slots that this rank serves, in slot order.
  for (int d = 0; d < n; ++d) {
    if (d == me) continue;
    for (int64_t s = 0; s < next.slots_per_rank; ++s) {
      const int32_t e = next.physical_to_logical[d * next.slots_per_rank + s];
      if (e < 0 || owner[e] != me) continue;
      char* dst = send.data() + (d * max_rows + send_counts[d]++) * row;
      std::memcpy(dst, mine.w13.data() + owner_slot[e] * a, a);
      std::memcpy(dst + a, mine.w2.data() + owner_slot[e] * b, b);
    }
  }
  MOEKIT_RETURN_IF_ERROR(
      comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(), max_rows, row));
  std::vector<int32_t> taken(n, 0);
  for (int64_t s = 0; s < next.slots_per_rank; ++s) {
    const int32_t e = next.physical_to_logical[me * next.slots_per_rank + s];
    if (e < 0) continue;
    const int src = owner[e];
    if (src == me) {
      std::memcpy(out.w13.data() + s * a, mine.w13.data() + owner_slot[e] * a, a);
      std::memcpy(out.w2.data() + s * b, mine.w2.data() + owner_slot[e] * b, b);
      continue;
    }
    if (taken[src] >= recv_counts[src]) {
      return Internal("eplb: rank " + std::to_string(src) + " sent " + std::to_string(recv_counts[src]) +
                      " experts to rank " + std::to_string(me) + ", fewer than the placement needs");
    }
    const char* from = recv.data() + (src * max_rows + taken[src]++) * row;
    std::memcpy(out.w13.data() + s * a, from, a);
    std::memcpy(out.w2.data() + s * b, from + a, b);
  }
  return out;
}

}  // namespace moekit::eplb
