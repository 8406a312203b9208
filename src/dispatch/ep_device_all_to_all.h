// The expert-parallel prepare/finalize on GPUs (docs/design.md §1, §2.5;
// docs/expert_parallel.md "The GPU path"): all-to-all over a communicator
// whose buffers live on the device (NCCL), with every step a device kernel.
//
// prepare: replica choice -> per-destination row numbers (prefix sums, token
// order) -> pack one row per (token, destination rank) -> all_to_all_v ->
// unpack into the experts stage's inputs ([N·T] rows, skip ids -1).
// finalize: each received row's partial output goes back to its source
// (all_to_all_v with the receive counts as send counts) -> per-token sum of
// the partials in rank order.
//
// Every buffer is allocated by create() for the worst case (every token of
// every rank to every rank); counts never leave the device, so prepare and
// finalize allocate nothing, never wait on the host, and can be captured in a
// CUDA graph.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dispatch/cuda/ep_dispatch.h"
#include "moekit/comm.h"
#include "moekit/device_buffer.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::dispatch {

// This rank's routed tokens (device pointers on the communicator's device).
struct EpDeviceTokens {
  int64_t num_tokens = 0;               // m <= T (0: the rank still takes part)
  const uint16_t* hidden = nullptr;     // [m, H] bf16, 16-byte aligned
  const int32_t* topk_ids = nullptr;    // [m, k] i32 logical
  const float* topk_weights = nullptr;  // [m, k] f32
};

// What prepare hands the experts stage: views into this object's buffers, M = N·T rows.
struct EpExpertsInputs {
  TensorView hidden;        // [N·T, H] bf16 (rows without a valid id are undefined)
  TensorView topk_ids;      // [N·T, k'] i32 local slots, -1 = skip (k' = min(k, S))
  TensorView topk_weights;  // [N·T, k'] f32
  TensorView out;           // [N·T, H] bf16: the experts stage writes each row's partial sum here
};

class EpDeviceAllToAll {
 public:
  // replicas: ExpertPlacement::replicas() ([E] lists of physical slots).
  static StatusOr<std::unique_ptr<EpDeviceAllToAll>> create(Communicator& comm, const cuda::EpDeviceShape& shape,
                                                            const std::vector<std::vector<int32_t>>& replicas);

  // A new placement's replicas with the same slots per rank (EPLB rebalance):
  // written over the table in place, after the device finished reading it.
  Status use_replicas(const std::vector<std::vector<int32_t>>& replicas);

  // Collective (all_to_all_v).
  StatusOr<EpExpertsInputs> prepare(const EpDeviceTokens& tokens, cudaStream_t stream);
  // Collective. After the experts stage filled EpExpertsInputs::out: out [m, H]
  // bf16 of the tokens of the last prepare(); topk_ids as given to it;
  // shared_out/shared_gate (optional): the shared expert's addend (cuda::CombineArgs).
  Status finalize(const int32_t* topk_ids, uint16_t* out, const uint16_t* shared_out, const float* shared_gate,
                  cudaStream_t stream);

  // (row, slot) pairs this rank's experts were given since create/reset
  // (reads the device: waits for the work enqueued so far).
  StatusOr<int64_t> computed_pairs() const;
  Status reset_computed_pairs();

  const cuda::EpDeviceShape& shape() const { return s_; }

 private:
  EpDeviceAllToAll(Communicator& comm, const cuda::EpDeviceShape& s) : comm_(comm), s_(s) {}

  Communicator& comm_;
  cuda::EpDeviceShape s_;
  int64_t num_tokens_ = 0;         // m of the last prepare
  DeviceBuffer replica_offsets_;   // [E + 1] i32
  DeviceBuffer replica_slots_;     // [N·S] i32: the replicas first
  DeviceBuffer physical_ids_;      // [T, k] i32
  DeviceBuffer needs_rank_;        // [N, T] i32 0/1
  DeviceBuffer row_of_;            // [N, T] i32: row in the block sent to each rank, or -1
  DeviceBuffer send_, recv_;       // [N, T, row_bytes]: dispatch rows
  DeviceBuffer send_counts_;       // [N] i32
  DeviceBuffer recv_counts_;       // [N] i32: also the combine's send counts
  DeviceBuffer return_counts_;     // [N] i32: rows returned by each rank (= send_counts_)
  DeviceBuffer hidden_;            // [N·T, H] bf16: received activations
  DeviceBuffer local_ids_;         // [N·T, k'] i32
  DeviceBuffer local_weights_;     // [N·T, k'] f32
  DeviceBuffer partial_;           // [N·T, H] bf16: the experts stage's output per received row
  DeviceBuffer returned_;          // [N, T, H] bf16: partials of this rank's tokens, by rank
  DeviceBuffer computed_pairs_;    // [1] u64
};

}  // namespace moekit::dispatch

#endif  // MOEKIT_WITH_CUDA
