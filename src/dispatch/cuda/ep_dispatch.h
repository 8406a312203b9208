// Device kernels of the expert-parallel all-to-all on GPUs (docs/design.md §2.5,
// docs/expert_parallel.md "The GPU path"): everything between a rank's routed
// ids and the inputs of its experts, and back. Each launcher enqueues on one
// stream; none allocates or waits on the host, so a forward can be captured
// in a CUDA graph. Buffers are sized for the worst case by the caller
// (ep_device_all_to_all.h): N ranks, T = max_tokens per rank.
//
// The dispatch row that travels to a rank d (one per token that needs d):
//   [k] i32   the token's slot j as a slot local to d, or -1 when slot j lives elsewhere
//   [k] f32   the token's top-k weights
//   pad to 16 bytes, then [H] bf16 activations (exact).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "moekit/status.h"

namespace moekit::dispatch::cuda {

// The sizes every rank of the group shares, plus this rank's index.
struct EpDeviceShape {
  int ranks = 1;               // N
  int rank = 0;                // this rank
  int64_t max_tokens = 0;      // T: tokens per rank at most
  int64_t hidden = 0;          // H, a multiple of 8
  int64_t top_k = 0;           // k
  int64_t num_logical = 0;     // E
  int64_t slots_per_rank = 0;  // S
  // constexpr: also called in kernels (--expt-relaxed-constexpr).
  // Experts-stage slots per received token: at most min(k, S) of a token's slots live on one rank.
  constexpr int64_t local_top_k() const { return top_k < slots_per_rank ? top_k : slots_per_rank; }
  constexpr size_t header_bytes() const { return (static_cast<size_t>(8 * top_k) + 15) / 16 * 16; }
  constexpr size_t row_bytes() const { return header_bytes() + static_cast<size_t>(2 * hidden); }
  constexpr int64_t received_rows() const { return ranks * max_tokens; }  // N·T: the experts stage's M
};

// Step 1, per token: the physical slot of each (token, slot) by the replica
// rule (ep_replica_table.h; key = rank·T + t), and which ranks the token needs.
struct DestinationArgs {
  int64_t num_tokens = 0;                // m <= T
  const int32_t* topk_ids = nullptr;     // [m, k] i32 logical; ids outside [0, E) go nowhere
  const int32_t* replica_offsets = nullptr;  // [E + 1] i32
  const int32_t* replica_slots = nullptr;    // [replicas] i32
  int32_t* physical_ids = nullptr;       // [T, k] i32 out: rows [0, m), -1 for a bad id
  int32_t* needs_rank = nullptr;         // [N, T] i32 out: 1 when token t sends a row to rank d, else 0 (cols [0, m))
};
Status ep_choose_destinations(const EpDeviceShape& s, const DestinationArgs& a, cudaStream_t stream);

// Step 2, per destination rank (one block each, a block-wide prefix sum over
// tokens in order): row_of[d, t] = the token's row in the block sent to d, or
// -1; send_counts[d] = rows sent to d. Deterministic: no atomics.
Status ep_number_rows(const EpDeviceShape& s, int64_t num_tokens, const int32_t* needs_rank, int32_t* row_of,
                      int32_t* send_counts, cudaStream_t stream);

// Step 3: writes every token's row into the send blocks [N, T, row_bytes].
struct PackArgs {
  int64_t num_tokens = 0;               // m
  const uint16_t* hidden = nullptr;     // [m, H] bf16
  const int32_t* physical_ids = nullptr;  // [T, k] i32
  const float* topk_weights = nullptr;  // [m, k] f32
  const int32_t* row_of = nullptr;      // [N, T] i32
  char* send = nullptr;                 // [N, T, row_bytes] out: rows [0, send_counts[d]) of block d
};
Status ep_pack_rows(const EpDeviceShape& s, const PackArgs& a, cudaStream_t stream);

// Step 4: the received blocks as the experts stage's inputs, row q = src·T + i.
// Row q's ids are its valid local slots moved to the front in slot order (so
// the experts stage reduces them in the token's slot order), then -1; rows past
// recv_counts[src] get only -1 (the experts stage skips them: output 0).
struct UnpackArgs {
  const char* recv = nullptr;          // [N, T, row_bytes]
  const int32_t* recv_counts = nullptr;  // [N] i32
  uint16_t* hidden = nullptr;          // [N·T, H] bf16 out: valid rows only (the rest is never read)
  int32_t* local_ids = nullptr;        // [N·T, k'] i32 out, k' = local_top_k()
  float* local_weights = nullptr;      // [N·T, k'] f32 out (0 where the id is -1)
  unsigned long long* computed_pairs = nullptr;  // [1] u64, optional: += the valid (row, slot) pairs
};
Status ep_unpack_rows(const EpDeviceShape& s, const UnpackArgs& a, cudaStream_t stream);

// Step 6: out[t] = bf16(sum over d = 0..N-1 of returned[d, row_of[d, t]]
// + shared_gate[t] * shared_out[t]), in fp32, rank order from +0, the shared
// expert last (as the single-GPU finalize adds it); a token with an id outside
// [0, E) gets NaN (the single-GPU layer's rule for a bad id).
struct CombineArgs {
  int64_t num_tokens = 0;              // m
  const int32_t* topk_ids = nullptr;   // [m, k] i32 logical
  const int32_t* row_of = nullptr;     // [N, T] i32
  const uint16_t* returned = nullptr;  // [N, T, H] bf16: block d row r = rank d's partial of the token it got as row r
  uint16_t* out = nullptr;             // [m, H] bf16, every element written
  const uint16_t* shared_out = nullptr;  // [m, H] bf16, optional: the shared expert's output on this rank's tokens
  const float* shared_gate = nullptr;    // [m] f32, optional with shared_out (gate 1 when absent)
};
Status ep_combine_partials(const EpDeviceShape& s, const CombineArgs& a, cudaStream_t stream);

}  // namespace moekit::dispatch::cuda

#endif  // MOEKIT_WITH_CUDA
