#include "eplb/slot_weights.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace moekit::eplb {

TensorView SlotWeights::w13_view() const {
  return TensorView::contiguous(const_cast<char*>(w13.data()), dtype, {slots, n1, hidden});
}
TensorView SlotWeights::w2_view() const {
  return TensorView::contiguous(const_cast<char*>(w2.data()), dtype, {slots, hidden, intermediate});
}

MoeWeights SlotWeights::kernel_weights() const {
  MoeWeights w;
  w.w13 = w13_view();
  w.w2 = w2_view();
  if (has_bias) {
    w.w13_bias = TensorView::contiguous(const_cast<char*>(w13_bias.data()), bias_dtype, {slots, n1});
    w.w2_bias = TensorView::contiguous(const_cast<char*>(w2_bias.data()), bias_dtype, {slots, hidden});
  }
  return w;
}

namespace {

// One slot's weights are these parts, each a fixed number of bytes per slot.
template <typename Storage>
struct Part {
  Storage* storage;
  size_t bytes;  // per slot
};
template <typename W>  // SlotWeights or const SlotWeights
auto parts_of(W& w) {
  using P = Part<std::conditional_t<std::is_const_v<W>, const std::vector<char>, std::vector<char>>>;
  return std::array<P, 4>{P{&w.w13, w.w13_bytes()}, P{&w.w2, w.w2_bytes()}, P{&w.w13_bias, w.w13_bias_bytes()},
                          P{&w.w2_bias, w.w2_bias_bytes()}};
}

SlotWeights empty_slots(DType dtype, bool has_bias, DType bias_dtype, int64_t slots, int64_t n1, int64_t H,
                        int64_t I) {
  SlotWeights w;
  w.dtype = dtype;
  w.has_bias = has_bias;
  w.bias_dtype = bias_dtype;
  w.slots = slots;
  w.n1 = n1;
  w.hidden = H;
  w.intermediate = I;
  for (const auto& p : parts_of(w)) p.storage->assign(slots * p.bytes, 0);
  return w;
}

// The weights a slot copies from: the four tensors, biases optional (both or none), rows = experts or slots.
StatusOr<std::array<const char*, 4>> sources(const MoeWeights& src, const char* what, int64_t rows, DType dtype,
                                             int64_t n1, int64_t H, int64_t I, bool* has_bias, DType* bias_dtype) {
  const std::string w = what;
  MOEKIT_RETURN_IF_ERROR(check_tensor(src.w13, "w13" + w, {dtype}, {rows, n1, H}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(src.w2, "w2" + w, {dtype}, {rows, H, I}, Device::cpu()));
  if (src.w13_bias.defined() != src.w2_bias.defined()) {
    return InvalidArgument("w13_bias/w2_bias" + w + ": give both expert biases or neither");
  }
  *has_bias = src.w13_bias.defined();
  *bias_dtype = *has_bias ? src.w13_bias.dtype : DType::kF32;
  if (*has_bias) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(src.w13_bias, "w13_bias" + w, {DType::kF32, dtype}, {rows, n1}, Device::cpu()));
    MOEKIT_RETURN_IF_ERROR(check_tensor(src.w2_bias, "w2_bias" + w, {*bias_dtype}, {rows, H}, Device::cpu()));
  }
  return std::array<const char*, 4>{src.w13.ptr<const char>(), src.w2.ptr<const char>(),
                                    *has_bias ? src.w13_bias.ptr<const char>() : nullptr,
                                    *has_bias ? src.w2_bias.ptr<const char>() : nullptr};
}

// Slot s of `w` gets row `row` of every source part.
void copy_slot(SlotWeights& w, int64_t s, const std::array<const char*, 4>& src, int64_t row) {
  const auto parts = parts_of(w);
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t b = parts[i].bytes;
    if (b > 0) std::memcpy(parts[i].storage->data() + s * b, src[i] + row * b, b);
  }
}

}  // namespace

StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& p, int rank,
                                                DType dtype, int64_t n1, int64_t H, int64_t I) {
  bool has_bias = false;
  DType bias_dtype = DType::kF32;
  MOEKIT_ASSIGN_OR_RETURN(const auto src, sources(logical, "", p.num_logical, dtype, n1, H, I, &has_bias, &bias_dtype));
  SlotWeights w = empty_slots(dtype, has_bias, bias_dtype, p.slots_per_rank, n1, H, I);
  for (int64_t s = 0; s < p.slots_per_rank; ++s) {
    const int32_t e = p.physical_to_logical[rank * p.slots_per_rank + s];
    if (e >= 0) copy_slot(w, s, src, e);
  }
  return w;
}

StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& p, int rank,
                                              DType dtype, int64_t n1, int64_t H, int64_t I) {
  const int64_t S = p.slots_per_rank;
  bool has_bias = false;
  DType bias_dtype = DType::kF32;
  MOEKIT_ASSIGN_OR_RETURN(const auto src,
                          sources(local, " (this rank's slots)", S, dtype, n1, H, I, &has_bias, &bias_dtype));
  SlotWeights w = empty_slots(dtype, has_bias, bias_dtype, S, n1, H, I);
  for (int64_t s = 0; s < S; ++s) {
    if (p.physical_to_logical[rank * S + s] >= 0) copy_slot(w, s, src, s);
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
  SlotWeights out = empty_slots(mine.dtype, mine.has_bias, mine.bias_dtype, next.slots_per_rank, mine.n1, mine.hidden,
                                mine.intermediate);
  const auto from_parts = parts_of(mine);
  const auto to_parts = parts_of(out);
  size_t row = 0;
  for (const auto& p : from_parts) row += p.bytes;  // one expert, every part back to back
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
      for (const auto& p : from_parts) {
        if (p.bytes == 0) continue;  // a part the layer does not have (no biases)
        std::memcpy(dst, p.storage->data() + owner_slot[e] * p.bytes, p.bytes);
        dst += p.bytes;
      }
    }
  }
  MOEKIT_RETURN_IF_ERROR(
      comm.all_to_all_v(send.data(), send_counts.data(), recv.data(), recv_counts.data(), max_rows, row));
  std::vector<int32_t> taken(n, 0);
  for (int64_t s = 0; s < next.slots_per_rank; ++s) {
    const int32_t e = next.physical_to_logical[me * next.slots_per_rank + s];
    if (e < 0) continue;
    const int from_rank = owner[e];
    if (from_rank != me && taken[from_rank] >= recv_counts[from_rank]) {
      return Internal("eplb: rank " + std::to_string(from_rank) + " sent " + std::to_string(recv_counts[from_rank]) +
                      " experts to rank " + std::to_string(me) + ", fewer than the placement needs");
    }
    const char* from = from_rank == me ? nullptr : recv.data() + (from_rank * max_rows + taken[from_rank]++) * row;
    for (size_t i = 0; i < to_parts.size(); ++i) {
      const size_t bytes = to_parts[i].bytes;
      if (bytes == 0) continue;  // a part the layer does not have (no biases)
      const char* part = from_rank == me ? from_parts[i].storage->data() + owner_slot[e] * bytes : from;
      std::memcpy(to_parts[i].storage->data() + s * bytes, part, bytes);
      if (from != nullptr) from += bytes;
    }
  }
  return out;
}

}  // namespace moekit::eplb
