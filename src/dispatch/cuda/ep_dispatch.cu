// Expert-parallel dispatch on the device, steps 1-4: see ep_dispatch.h.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "dispatch/cuda/ep_dispatch.h"
#include "dispatch/ep_replica_table.h"

namespace moekit::dispatch::cuda {

namespace {

constexpr int kMaxRanks = 64;   // a token's destinations are one 64-bit mask
constexpr int kMaxTopk = 32;    // as the device router (route_cuda.h kMaxDeviceTopk)
constexpr int kThreads = 128;   // per block of the row kernels
constexpr int kScanThreads = 256;
constexpr int kVec = 8;         // bf16 per 16-byte access

Status check_shape(const EpDeviceShape& s) {
  if (s.ranks < 1 || s.ranks > kMaxRanks) {
    return InvalidArgument("ep device dispatch: " + std::to_string(s.ranks) + " ranks; supports 1 to " +
                           std::to_string(kMaxRanks));
  }
  if (s.top_k < 1 || s.top_k > kMaxTopk) {
    return InvalidArgument("ep device dispatch: top_k " + std::to_string(s.top_k) + " not in [1, " +
                           std::to_string(kMaxTopk) + "]");
  }
  if (s.hidden < kVec || s.hidden % kVec != 0) {
    return InvalidArgument("ep device dispatch: hidden " + std::to_string(s.hidden) + " must be a multiple of 8");
  }
  if (s.slots_per_rank < 1 || s.max_tokens < 1 || s.received_rows() * s.top_k > INT32_MAX) {
    return InvalidArgument("ep device dispatch: slots_per_rank and max_tokens must be >= 1 and N·T·k < 2^31");
  }
  return Status::Ok();
}

__global__ void choose_destinations_kernel(EpDeviceShape s, DestinationArgs a) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.num_tokens) return;
  const int64_t key = static_cast<int64_t>(s.rank) * s.max_tokens + t;  // NOTE: as replica_for_token's key on the host path
  const int32_t E = static_cast<int32_t>(s.num_logical);
  unsigned long long ranks_needed = 0;
  for (int64_t j = 0; j < s.top_k; ++j) {
    const int32_t logical = a.topk_ids[t * s.top_k + j];
    const int32_t slot = replica_slot(a.replica_offsets, a.replica_slots, E, logical, key);
    a.physical_ids[t * s.top_k + j] = slot;
    if (slot >= 0) ranks_needed |= 1ull << (slot / s.slots_per_rank);
  }
  for (int d = 0; d < s.ranks; ++d) a.needs_rank[d * s.max_tokens + t] = static_cast<int32_t>((ranks_needed >> d) & 1ull);
}

// One block per destination: an exclusive prefix sum over the tokens, tile by tile.
__global__ void __launch_bounds__(kScanThreads) number_rows_kernel(int64_t num_tokens, int64_t max_tokens,
                                                                   const int32_t* needs_rank, int32_t* row_of,
                                                                   int32_t* send_counts) {
  using BlockScan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename BlockScan::TempStorage temp;
  __shared__ int32_t rows_before_tile;
  const int64_t d = blockIdx.x;
  const int32_t* needs = needs_rank + d * max_tokens;
  int32_t* rows = row_of + d * max_tokens;
  if (threadIdx.x == 0) rows_before_tile = 0;
  __syncthreads();
  for (int64_t base = 0; base < num_tokens; base += kScanThreads) {
    const int64_t t = base + threadIdx.x;
    const int32_t flag = t < num_tokens ? needs[t] : 0;
    int32_t before = 0, tile_total = 0;
    BlockScan(temp).ExclusiveSum(flag, before, tile_total);
    if (t < num_tokens) rows[t] = flag != 0 ? rows_before_tile + before : -1;
    __syncthreads();  // every thread has read rows_before_tile, and temp may be reused
    if (threadIdx.x == 0) rows_before_tile += tile_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) send_counts[d] = rows_before_tile;
}

// One block per token: the header of each row it sends, then its activations,
// each 16-byte chunk read once and written to every destination.
__global__ void __launch_bounds__(kThreads) pack_rows_kernel(EpDeviceShape s, PackArgs a) {
  __shared__ int32_t row_in_block[kMaxRanks];
  const int64_t t = blockIdx.x;
  const int64_t k = s.top_k, T = s.max_tokens;
  for (int d = threadIdx.x; d < s.ranks; d += blockDim.x) row_in_block[d] = a.row_of[d * T + t];
  __syncthreads();
  const size_t row_bytes = s.row_bytes();
  for (int d = 0; d < s.ranks; ++d) {
    const int32_t r = row_in_block[d];
    if (r < 0 || threadIdx.x >= k) continue;
    char* row = a.send + (d * T + r) * row_bytes;
    const int64_t j = threadIdx.x;
    const int32_t slot = a.physical_ids[t * k + j];
    const bool here = slot >= 0 && slot / s.slots_per_rank == d;
    reinterpret_cast<int32_t*>(row)[j] = here ? static_cast<int32_t>(slot % s.slots_per_rank) : -1;
    reinterpret_cast<float*>(row + 4 * k)[j] = a.topk_weights[t * k + j];
  }
  const int64_t chunks = s.hidden / kVec;
  const uint4* src = reinterpret_cast<const uint4*>(a.hidden + t * s.hidden);
  const size_t header = s.header_bytes();
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const uint4 v = src[c];
    for (int d = 0; d < s.ranks; ++d) {
      const int32_t r = row_in_block[d];
      if (r >= 0) reinterpret_cast<uint4*>(a.send + (d * T + r) * row_bytes + header)[c] = v;
    }
  }
}

// One block per received row q = src·T + i.
__global__ void __launch_bounds__(kThreads) unpack_rows_kernel(EpDeviceShape s, UnpackArgs a) {
  const int64_t q = blockIdx.x;
  const int64_t src = q / s.max_tokens, i = q % s.max_tokens;
  const bool valid = i < a.recv_counts[src];
  const int64_t k = s.top_k, lk = s.local_top_k();
  const char* row = a.recv + q * s.row_bytes();
  if (threadIdx.x == 0) {
    int64_t n = 0;
    if (valid) {
      const int32_t* want = reinterpret_cast<const int32_t*>(row);
      const float* w = reinterpret_cast<const float*>(row + 4 * k);
      for (int64_t j = 0; j < k && n < lk; ++j) {
        if (want[j] < 0) continue;
        a.local_ids[q * lk + n] = want[j];
        a.local_weights[q * lk + n] = w[j];
        ++n;
      }
      if (a.computed_pairs != nullptr && n > 0) atomicAdd(a.computed_pairs, static_cast<unsigned long long>(n));
    }
    for (int64_t j = n; j < lk; ++j) {
      a.local_ids[q * lk + j] = -1;
      a.local_weights[q * lk + j] = 0.0f;
    }
  }
  if (!valid) return;
  const uint4* x = reinterpret_cast<const uint4*>(row + s.header_bytes());
  uint4* dst = reinterpret_cast<uint4*>(a.hidden + q * s.hidden);
  for (int64_t c = threadIdx.x; c < s.hidden / kVec; c += blockDim.x) dst[c] = x[c];
}

}  // namespace

Status ep_choose_destinations(const EpDeviceShape& s, const DestinationArgs& a, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(check_shape(s));
  if (a.num_tokens < 0 || a.num_tokens > s.max_tokens) {
    return InvalidArgument("ep device dispatch: " + std::to_string(a.num_tokens) + " tokens; at most " +
                           std::to_string(s.max_tokens));
  }
  if (a.num_tokens == 0) return Status::Ok();
  const unsigned blocks = static_cast<unsigned>((a.num_tokens + kThreads - 1) / kThreads);
  choose_destinations_kernel<<<blocks, kThreads, 0, stream>>>(s, a);
  MOEKIT_CUDA_CHECK_LAUNCH("choose_destinations_kernel");
  return Status::Ok();
}

Status ep_number_rows(const EpDeviceShape& s, int64_t num_tokens, const int32_t* needs_rank, int32_t* row_of,
                      int32_t* send_counts, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(check_shape(s));
  // Launched for m = 0 too: it writes the zero counts the all-to-all sends.
  number_rows_kernel<<<static_cast<unsigned>(s.ranks), kScanThreads, 0, stream>>>(num_tokens, s.max_tokens,
                                                                                 needs_rank, row_of, send_counts);
  MOEKIT_CUDA_CHECK_LAUNCH("number_rows_kernel");
  return Status::Ok();
}

Status ep_pack_rows(const EpDeviceShape& s, const PackArgs& a, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(check_shape(s));
  if (a.num_tokens == 0) return Status::Ok();
  pack_rows_kernel<<<static_cast<unsigned>(a.num_tokens), kThreads, 0, stream>>>(s, a);
  MOEKIT_CUDA_CHECK_LAUNCH("pack_rows_kernel");
  return Status::Ok();
}

Status ep_unpack_rows(const EpDeviceShape& s, const UnpackArgs& a, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(check_shape(s));
  unpack_rows_kernel<<<static_cast<unsigned>(s.received_rows()), kThreads, 0, stream>>>(s, a);
  MOEKIT_CUDA_CHECK_LAUNCH("unpack_rows_kernel");
  return Status::Ok();
}

}  // namespace moekit::dispatch::cuda
