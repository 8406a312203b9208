// Expert-parallel all-to-all on GPUs: see ep_device_all_to_all.h.
#include "dispatch/ep_device_all_to_all.h"

#ifdef MOEKIT_WITH_CUDA

#include <string>

#include "core/cuda_check.h"
#include "dispatch/ep_replica_table.h"

namespace moekit::dispatch {

namespace {

Status allocate(DeviceBuffer* b, Device device, size_t bytes) {
  MOEKIT_ASSIGN_OR_RETURN(*b, DeviceBuffer::allocate(device, bytes));
  return Status::Ok();
}

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

}  // namespace

StatusOr<std::unique_ptr<EpDeviceAllToAll>> EpDeviceAllToAll::create(
    Communicator& comm, const cuda::EpDeviceShape& shape, const std::vector<std::vector<int32_t>>& replicas) {
  const Device dev = comm.device();
  if (dev.type != DeviceType::kCuda) {
    return InvalidArgument("ep device all-to-all: needs a communicator on a CUDA device, got " + dev.to_string());
  }
  if (shape.ranks != comm.size() || shape.rank != comm.rank()) {
    return InvalidArgument("ep device all-to-all: shape made for rank " + std::to_string(shape.rank) + " of " +
                           std::to_string(shape.ranks) + ", communicator is rank " + std::to_string(comm.rank()) +
                           " of " + std::to_string(comm.size()));
  }
  std::unique_ptr<EpDeviceAllToAll> a(new EpDeviceAllToAll(comm, shape));
  const size_t N = static_cast<size_t>(shape.ranks), T = static_cast<size_t>(shape.max_tokens);
  const size_t H = static_cast<size_t>(shape.hidden), k = static_cast<size_t>(shape.top_k);
  const size_t rows = N * T, lk = static_cast<size_t>(shape.local_top_k());
  // The replica table, sized for its largest form: E + 1 offsets, one entry per physical slot.
  MOEKIT_RETURN_IF_ERROR(allocate(&a->replica_offsets_, dev, (shape.num_logical + 1) * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->replica_slots_, dev, N * shape.slots_per_rank * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(a->use_replicas(replicas));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->physical_ids_, dev, T * k * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->needs_rank_, dev, rows * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->row_of_, dev, rows * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->send_, dev, rows * shape.row_bytes()));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->recv_, dev, rows * shape.row_bytes()));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->send_counts_, dev, N * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->recv_counts_, dev, N * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->return_counts_, dev, N * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->hidden_, dev, rows * H * 2));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->local_ids_, dev, rows * lk * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->local_weights_, dev, rows * lk * sizeof(float)));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->partial_, dev, rows * H * 2));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->returned_, dev, rows * H * 2));
  MOEKIT_RETURN_IF_ERROR(allocate(&a->computed_pairs_, dev, sizeof(unsigned long long)));
  MOEKIT_RETURN_IF_ERROR(a->reset_computed_pairs());
  return a;
}

Status EpDeviceAllToAll::use_replicas(const std::vector<std::vector<int32_t>>& replicas) {
  if (static_cast<int64_t>(replicas.size()) != s_.num_logical) {
    return InvalidArgument("ep device all-to-all: replicas for " + std::to_string(replicas.size()) +
                           " experts, shape has " + std::to_string(s_.num_logical));
  }
  MOEKIT_ASSIGN_OR_RETURN(ReplicaTable table, make_replica_table(replicas));
  const int64_t physical = s_.ranks * s_.slots_per_rank;
  if (static_cast<int64_t>(table.slots.size()) > physical) {
    return InvalidArgument("ep device all-to-all: " + std::to_string(table.slots.size()) + " replicas for " +
                           std::to_string(physical) + " physical slots");
  }
  for (int32_t slot : table.slots) {
    if (slot < 0 || slot >= physical) {
      return InvalidArgument("ep device all-to-all: physical slot " + std::to_string(slot) + " not in [0, " +
                             std::to_string(physical) + ")");
    }
  }
  const Device dev = comm_.device(), host = Device::cpu();
  // In place: the device may still be reading the table of an earlier forward.
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(dev));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(replica_offsets_.data(), dev, table.offsets.data(), host,
                                                  table.offsets.size() * sizeof(int32_t)));
  return DeviceBuffer::copy_bytes(replica_slots_.data(), dev, table.slots.data(), host,
                                  table.slots.size() * sizeof(int32_t));
}

StatusOr<EpExpertsInputs> EpDeviceAllToAll::prepare(const EpDeviceTokens& in, cudaStream_t stream) {
  const int64_t T = s_.max_tokens, rows = s_.received_rows(), lk = s_.local_top_k();
  if (in.num_tokens < 0 || in.num_tokens > T) {
    return InvalidArgument("ep device all-to-all: " + std::to_string(in.num_tokens) + " tokens; at most " +
                           std::to_string(T));
  }
  num_tokens_ = in.num_tokens;
  cuda::DestinationArgs da;
  da.num_tokens = in.num_tokens;
  da.topk_ids = in.topk_ids;
  da.replica_offsets = ptr<const int32_t>(replica_offsets_);
  da.replica_slots = ptr<const int32_t>(replica_slots_);
  da.physical_ids = ptr<int32_t>(physical_ids_);
  da.needs_rank = ptr<int32_t>(needs_rank_);
  MOEKIT_RETURN_IF_ERROR(cuda::ep_choose_destinations(s_, da, stream));
  MOEKIT_RETURN_IF_ERROR(cuda::ep_number_rows(s_, in.num_tokens, ptr<const int32_t>(needs_rank_),
                                              ptr<int32_t>(row_of_), ptr<int32_t>(send_counts_), stream));
  cuda::PackArgs pa;
  pa.num_tokens = in.num_tokens;
  pa.hidden = in.hidden;
  pa.physical_ids = ptr<const int32_t>(physical_ids_);
  pa.topk_weights = in.topk_weights;
  pa.row_of = ptr<const int32_t>(row_of_);
  pa.send = ptr<char>(send_);
  MOEKIT_RETURN_IF_ERROR(cuda::ep_pack_rows(s_, pa, stream));
  MOEKIT_RETURN_IF_ERROR(comm_.all_to_all_v(send_.data(), ptr<const int32_t>(send_counts_), recv_.data(),
                                            ptr<int32_t>(recv_counts_), T, s_.row_bytes(), stream));
  cuda::UnpackArgs ua;
  ua.recv = ptr<const char>(recv_);
  ua.recv_counts = ptr<const int32_t>(recv_counts_);
  ua.hidden = ptr<uint16_t>(hidden_);
  ua.local_ids = ptr<int32_t>(local_ids_);
  ua.local_weights = ptr<float>(local_weights_);
  ua.computed_pairs = ptr<unsigned long long>(computed_pairs_);
  MOEKIT_RETURN_IF_ERROR(cuda::ep_unpack_rows(s_, ua, stream));
  const Device dev = comm_.device();
  EpExpertsInputs x;
  x.hidden = TensorView::contiguous(hidden_.data(), DType::kBF16, {rows, s_.hidden}, dev);
  x.topk_ids = TensorView::contiguous(local_ids_.data(), DType::kI32, {rows, lk}, dev);
  x.topk_weights = TensorView::contiguous(local_weights_.data(), DType::kF32, {rows, lk}, dev);
  x.out = TensorView::contiguous(partial_.data(), DType::kBF16, {rows, s_.hidden}, dev);
  return x;
}

Status EpDeviceAllToAll::finalize(const int32_t* topk_ids, uint16_t* out, const uint16_t* shared_out,
                                  const float* shared_gate, cudaStream_t stream) {
  // Received block s holds rank s's tokens in the order it sent them; the
  // partials go back block for block, so rank s finds its row r at [me, r].
  MOEKIT_RETURN_IF_ERROR(comm_.all_to_all_v(partial_.data(), ptr<const int32_t>(recv_counts_), returned_.data(),
                                            ptr<int32_t>(return_counts_), s_.max_tokens,
                                            static_cast<size_t>(2 * s_.hidden), stream));
  cuda::CombineArgs ca;
  ca.num_tokens = num_tokens_;
  ca.topk_ids = topk_ids;
  ca.row_of = ptr<const int32_t>(row_of_);
  ca.returned = ptr<const uint16_t>(returned_);
  ca.out = out;
  ca.shared_out = shared_out;
  ca.shared_gate = shared_gate;
  return cuda::ep_combine_partials(s_, ca, stream);
}

StatusOr<int64_t> EpDeviceAllToAll::computed_pairs() const {
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // the counter is added to on the forwards' streams
  unsigned long long v = 0;
  MOEKIT_CUDA_CHECK(cudaMemcpy(&v, computed_pairs_.data(), sizeof v, cudaMemcpyDeviceToHost));
  return static_cast<int64_t>(v);
}

Status EpDeviceAllToAll::reset_computed_pairs() {
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  MOEKIT_CUDA_CHECK(cudaMemset(computed_pairs_.data(), 0, sizeof(unsigned long long)));
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

}  // namespace moekit::dispatch

#endif  // MOEKIT_WITH_CUDA
