#include "eplb/slot_weights.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/weight4.h"
#include "moekit/device_buffer.h"

namespace moekit::eplb {

size_t SlotPart::slot_bytes() const {
  if (!present) return 0;
  int64_t n = 1;
  for (int64_t d : slot_shape) n *= d;
  return static_cast<size_t>(n) * dtype_size(dtype);
}

SlotPart& SlotWeights::part(TensorView MoeWeights::*field) {
  return *std::find_if(parts.begin(), parts.end(), [&](const SlotPart& p) { return p.field == field; });
}
const SlotPart& SlotWeights::part(TensorView MoeWeights::*field) const {
  return *std::find_if(parts.begin(), parts.end(), [&](const SlotPart& p) { return p.field == field; });
}

namespace {

std::vector<int64_t> with_rows(int64_t rows, const std::vector<int64_t>& slot_shape) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), slot_shape.begin(), slot_shape.end());
  return shape;
}

}  // namespace

MoeWeights SlotWeights::kernel_weights() const {
  MoeWeights w;
  for (const SlotPart& p : parts) {
    if (p.present) w.*p.field = TensorView::contiguous(const_cast<char*>(p.data.data()), p.dtype, with_rows(slots, p.slot_shape));
  }
  return w;
}

namespace {

// The parts a layer of `c` has, one slot's shape each (MoeWeights' layouts,
// kernel.h); biases in their own dtypes.
std::array<SlotPart, kSlotParts> layout_of(const MoeConfig& c, DType w13_bias_dtype, DType w2_bias_dtype) {
  const QuantScheme& q = c.quant;
  const int64_t H = c.hidden, I = c.intermediate, P = c.activation.gated() ? 2 : 1, n1 = P * I;
  const auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
  const bool bias = c.has_expert_bias;
  std::array<SlotPart, kSlotParts> p = {
      SlotPart{"w13", &MoeWeights::w13, true, q.weight_dtype, {n1, q.stored_cols(H)}, {}},
      SlotPart{"w2", &MoeWeights::w2, true, q.weight_dtype, {H, q.stored_cols(I)}, {}},
      SlotPart{"w13_bias", &MoeWeights::w13_bias, bias, w13_bias_dtype, {n1}, {}},
      SlotPart{"w2_bias", &MoeWeights::w2_bias, bias, w2_bias_dtype, {H}, {}},
      SlotPart{"w13_scale", &MoeWeights::w13_scale, false, DType::kF32, {}, {}},
      SlotPart{"w2_scale", &MoeWeights::w2_scale, false, DType::kF32, {}, {}},
      SlotPart{"a13_scale", &MoeWeights::a13_scale, false, DType::kF32, {}, {}},
      SlotPart{"a2_scale", &MoeWeights::a2_scale, false, DType::kF32, {}, {}},
  };
  SlotPart &s13 = p[4], &s2 = p[5];
  switch (q.method) {
    case QuantMethod::kNone: break;
    case QuantMethod::kFp8Block128:
      s13.present = s2.present = true;
      s13.slot_shape = {P * blocks(I), blocks(H)};
      s2.slot_shape = {blocks(H), blocks(I)};
      break;
    case QuantMethod::kFp8PerTensor:
      s13.present = s2.present = true;
      s13.slot_shape = {P};  // w2_scale: one value per expert
      p[6].present = p[7].present = q.act_scale == ActScale::kStatic;
      break;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: {
      const int64_t g = weight4_group(q.method);
      s13.present = s2.present = true;
      s13.dtype = s2.dtype = weight4_scale_dtype(q.method);
      s13.slot_shape = {n1, H / g};
      s2.slot_shape = {H, I / g};
      break;
    }
  }
  return p;
}

// An empty slot's value of each part: zero weights and biases, unit scales
// (so that the kernels' scale checks hold for slots no token reaches).
void fill_empty(SlotPart& p, int64_t slot) {
  const size_t b = p.slot_bytes();
  if (b == 0) return;  // a part the layer does not have (no storage)
  char* dst = p.data.data() + slot * b;
  const bool scale = p.field == &MoeWeights::w13_scale || p.field == &MoeWeights::w2_scale ||
                     p.field == &MoeWeights::a13_scale || p.field == &MoeWeights::a2_scale;
  if (!scale) {
    std::memset(dst, 0, b);
  } else if (p.dtype == DType::kU8) {
    std::memset(dst, 127, b);  // E8M0 2^0
  } else {
    const float one = 1.0f;
    for (size_t i = 0; i < b; i += sizeof(float)) std::memcpy(dst + i, &one, sizeof(float));
  }
}

SlotWeights empty_slots(std::array<SlotPart, kSlotParts> layout, int64_t slots) {
  SlotWeights w;
  w.slots = slots;
  w.parts = std::move(layout);
  for (SlotPart& p : w.parts) {
    p.data.assign(slots * p.slot_bytes(), 0);
    for (int64_t s = 0; s < slots; ++s) fill_empty(p, s);
  }
  return w;
}

// The layout of `c` checked against `src` (rows = experts or slots): every
// part the layer has, no part it lacks. Biases: each f32 or the weight dtype
// (bf16 for 4-bit weights), as the kernels take them.
StatusOr<std::array<SlotPart, kSlotParts>> checked_layout(const MoeWeights& src, const char* what, int64_t rows,
                                                          const MoeConfig& c) {
  const std::string w = what;
  const DType weight_bias = c.quant.is_weight4() ? DType::kBF16 : c.quant.weight_dtype;
  DType bias_dtype[2] = {DType::kF32, DType::kF32};
  const std::pair<const TensorView*, const char*> biases[2] = {{&src.w13_bias, "w13_bias"}, {&src.w2_bias, "w2_bias"}};
  for (int i = 0; i < 2; ++i) {
    const TensorView& b = *biases[i].first;
    if (b.defined()) bias_dtype[i] = b.dtype;
    if (c.has_expert_bias && bias_dtype[i] != DType::kF32 && bias_dtype[i] != weight_bias) {
      return InvalidArgument(biases[i].second + w + ": dtype " + dtype_name(bias_dtype[i]) +
                             "; expert biases are f32 or " + dtype_name(weight_bias));
    }
  }
  std::array<SlotPart, kSlotParts> layout = layout_of(c, bias_dtype[0], bias_dtype[1]);
  for (const SlotPart& p : layout) {
    const TensorView& t = src.*p.field;
    if (p.present) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(t, p.name + w, {p.dtype}, with_rows(rows, p.slot_shape), Device::cpu()));
    } else if (t.defined()) {
      return InvalidArgument(std::string(p.name) + w + ": given, but a layer of " + c.quant.to_string() +
                             (c.has_expert_bias ? "" : " without expert biases") + " takes no such tensor");
    }
  }
  return layout;
}

// Slot s of `w` gets row `row` of every present part of `src`.
void copy_slot(SlotWeights& w, int64_t s, const MoeWeights& src, int64_t row) {
  for (SlotPart& p : w.parts) {
    const size_t b = p.slot_bytes();
    if (b > 0) std::memcpy(p.data.data() + s * b, (src.*p.field).ptr<const char>() + row * b, b);
  }
}

// comm.all_to_all_v of host rows, where the communicator's collectives run:
// on host memory directly, on a device through device copies of both sides.
Status exchange_rows(Communicator& comm, const std::vector<char>& send, const std::vector<int32_t>& send_counts,
                     std::vector<char>* recv, std::vector<int32_t>* recv_counts, int64_t max_rows, size_t row) {
  const Device dev = comm.device(), host = Device::cpu();
  if (dev.type == DeviceType::kCpu) {
    return comm.all_to_all_v(send.data(), send_counts.data(), recv->data(), recv_counts->data(), max_rows, row);
  }
  const size_t counts_bytes = send_counts.size() * sizeof(int32_t);
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer d_send, DeviceBuffer::allocate(dev, send.size()));
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer d_recv, DeviceBuffer::allocate(dev, recv->size()));
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer d_counts, DeviceBuffer::allocate(dev, 2 * counts_bytes));
  auto* d_send_counts = static_cast<int32_t*>(d_counts.data());
  int32_t* d_recv_counts = d_send_counts + send_counts.size();
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(d_send.data(), dev, send.data(), host, send.size()));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(d_send_counts, dev, send_counts.data(), host, counts_bytes));
  MOEKIT_RETURN_IF_ERROR(comm.all_to_all_v(d_send.data(), d_send_counts, d_recv.data(), d_recv_counts, max_rows, row));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(dev));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(recv->data(), host, d_recv.data(), dev, recv->size()));
  return DeviceBuffer::copy_bytes(recv_counts->data(), host, d_recv_counts, dev, counts_bytes);
}

}  // namespace

StatusOr<SlotWeights> slot_weights_from_logical(const MoeWeights& logical, const ExpertPlacement& p, int rank,
                                                const MoeConfig& config) {
  MOEKIT_ASSIGN_OR_RETURN(auto layout, checked_layout(logical, "", p.num_logical, config));
  SlotWeights w = empty_slots(std::move(layout), p.slots_per_rank);
  for (int64_t s = 0; s < p.slots_per_rank; ++s) {
    const int32_t e = p.physical_to_logical[rank * p.slots_per_rank + s];
    if (e >= 0) copy_slot(w, s, logical, e);
  }
  return w;
}

StatusOr<SlotWeights> slot_weights_from_local(const MoeWeights& local, const ExpertPlacement& p, int rank,
                                              const MoeConfig& config) {
  const int64_t S = p.slots_per_rank;
  MOEKIT_ASSIGN_OR_RETURN(auto layout, checked_layout(local, " (this rank's slots)", S, config));
  SlotWeights w = empty_slots(std::move(layout), S);
  for (int64_t s = 0; s < S; ++s) {
    if (p.physical_to_logical[rank * S + s] >= 0) copy_slot(w, s, local, s);
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
  std::array<SlotPart, kSlotParts> layout = mine.parts;
  for (SlotPart& p : layout) p.data.clear();
  SlotWeights out = empty_slots(std::move(layout), next.slots_per_rank);
  size_t row = 0;
  for (const SlotPart& p : mine.parts) row += p.slot_bytes();  // one expert, every part back to back
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
      for (const SlotPart& p : mine.parts) {
        const size_t b = p.slot_bytes();
        if (b == 0) continue;  // a part the layer does not have
        std::memcpy(dst, p.data.data() + owner_slot[e] * b, b);
        dst += b;
      }
    }
  }
  MOEKIT_RETURN_IF_ERROR(exchange_rows(comm, send, send_counts, &recv, &recv_counts, max_rows, row));
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
    for (size_t i = 0; i < out.parts.size(); ++i) {
      const size_t b = out.parts[i].slot_bytes();
      if (b == 0) continue;  // a part the layer does not have
      const char* part = from_rank == me ? mine.parts[i].data.data() + owner_slot[e] * b : from;
      std::memcpy(out.parts[i].data.data() + s * b, part, b);
      if (from != nullptr) from += b;
    }
  }
  return out;
}

}  // namespace moekit::eplb
