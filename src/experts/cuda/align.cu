// Deterministic counting sort of (token, slot) pairs by expert: see align.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "experts/cuda/align.h"

namespace moekit::cuda {

namespace {

constexpr int64_t kMinChunk = 256;   // pairs one warp walks at least
constexpr int64_t kMaxChunks = 128;  // bounds the scratch at kMaxChunks·E counters
constexpr int kScanThreads = 1024;
constexpr int kWarpSize = 32;

int64_t num_chunks(int64_t pairs) { return std::max<int64_t>(1, std::min(kMaxChunks, (pairs + kMinChunk - 1) / kMinChunk)); }
int64_t chunk_size(int64_t pairs) { const int64_t c = num_chunks(pairs); return (pairs + c - 1) / c; }

// chunk_counts[c][e] += 1 for every pair of chunk c with id e.
__global__ void align_count_kernel(const int32_t* __restrict__ ids, int pairs, int chunk, int num_experts,
                                   int32_t* chunk_counts) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = ids[p];
  if (e < 0 || e >= num_experts) return;
  atomicAdd(&chunk_counts[static_cast<int64_t>(p / chunk) * num_experts + e], 1);  // integer: order-free
}

constexpr int kScanBatch = 16;    // cells of one column loaded before any is used
constexpr int kMaxScanParts = 8;  // slices of one expert's column summed by different threads

// Sum of chunk_counts[c][e] over c in [begin, end): loads issued in batches, not one by one.
__device__ int32_t column_sum(const int32_t* chunk_counts, int num_experts, int e, int begin, int end) {
  int32_t sum = 0;
  for (int c0 = begin; c0 < end; c0 += kScanBatch) {
    int32_t v[kScanBatch];
#pragma unroll
    for (int i = 0; i < kScanBatch; ++i) v[i] = c0 + i < end ? chunk_counts[static_cast<int64_t>(c0 + i) * num_experts + e] : 0;
#pragma unroll
    for (int i = 0; i < kScanBatch; ++i) sum += v[i];
  }
  return sum;
}

// chunk_counts[c][e] for c in [begin, end) -> run + the counts before it (exclusive scan from `run`).
__device__ void column_scan(int32_t* chunk_counts, int num_experts, int e, int begin, int end, int32_t run) {
  for (int c0 = begin; c0 < end; c0 += kScanBatch) {
    int32_t v[kScanBatch];
#pragma unroll
    for (int i = 0; i < kScanBatch; ++i) v[i] = c0 + i < end ? chunk_counts[static_cast<int64_t>(c0 + i) * num_experts + e] : 0;
#pragma unroll
    for (int i = 0; i < kScanBatch; ++i) {
      if (c0 + i < end) chunk_counts[static_cast<int64_t>(c0 + i) * num_experts + e] = run;
      run += v[i];
    }
  }
}

// One block: chunk_counts[c][e] -> absolute first row of expert e's pairs in chunk c;
// group_rows / group_start / expert_counts. Each expert's column of chunks is cut
// into up to kMaxScanParts slices summed by different threads, so a thread's
// chain of dependent global round trips is short (one thread per column took
// ~19-33 us at 128 chunks).
__global__ void __launch_bounds__(kScanThreads) align_scan_kernel(int chunks, int num_experts, int32_t* chunk_counts,
                                                                  int32_t* group_start, int32_t* group_rows,
                                                                  int32_t* expert_counts) {
  __shared__ int32_t part_sum[kScanThreads];  // [part][expert of the pass]
  __shared__ int32_t partial[kScanThreads];   // the expert scan's per-thread sums
  const int t = threadIdx.x;
  const int E = num_experts;
  // parts x span <= kScanThreads; span >= E unless parts == 1 (then experts come in passes).
  const int parts = max(1, min(kMaxScanParts, min(chunks, kScanThreads / E)));
  const int span = kScanThreads / parts;
  const int per_part = (chunks + parts - 1) / parts;
  const int part = t / span, lane_e = t % span;
  const int c_begin = min(chunks, part * per_part), c_end = min(chunks, c_begin + per_part);
  for (int e0 = 0; e0 < E; e0 += span) {
    const int e = e0 + lane_e;
    part_sum[t] = e < E && part < parts ? column_sum(chunk_counts, E, e, c_begin, c_end) : 0;
    __syncthreads();
    if (part == 0 && e < E) {
      int32_t total = 0;
      for (int q = 0; q < parts; ++q) total += part_sum[q * span + lane_e];
      group_rows[e] = total;
      if (expert_counts != nullptr) expert_counts[e] = total;
    }
    __syncthreads();
  }
  const int per = (E + kScanThreads - 1) / kScanThreads;
  const int begin = min(E, t * per), end = min(E, begin + per);
  int32_t sum = 0;
  for (int e = begin; e < end; ++e) sum += group_rows[e];
  partial[t] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off *= 2) {
    const int32_t v = t >= off ? partial[t - off] : 0;
    __syncthreads();
    partial[t] += v;
    __syncthreads();
  }
  int32_t run = partial[t] - sum;
  for (int e = begin; e < end; ++e) {
    group_start[e] = run;
    run += group_rows[e];
  }
  __syncthreads();
  // Slice q of expert e starts at group_start[e] plus the slices before it
  // (part_sum still holds them: with parts > 1 there was a single pass).
  for (int e0 = 0; e0 < E; e0 += span) {
    const int e = e0 + lane_e;
    if (e >= E || part >= parts) continue;
    int32_t first = group_start[e];
    for (int q = 0; q < part; ++q) first += part_sum[q * span + lane_e];
    column_scan(chunk_counts, E, e, c_begin, c_end, first);
  }
}

// One warp per chunk, 32 pairs a round in pair order: equal ids in a round are
// ranked by lane, and the chunk's counter of that expert advances by their number.
__global__ void align_scatter_kernel(const int32_t* __restrict__ ids, int pairs, int chunk, int chunks, int top_k,
                                     int num_experts, int32_t* chunk_next, int32_t* pair_row, int32_t* row_token) {
  const int lane = threadIdx.x % kWarpSize;
  const int c = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (c >= chunks) return;  // whole warp
  int32_t* next = chunk_next + static_cast<int64_t>(c) * num_experts;  // [E] this chunk's next row per expert
  const int begin = c * chunk, end = min(pairs, begin + chunk);
  for (int base = begin; base < end; base += kWarpSize) {
    const int p = base + lane;
    const int e = p < end ? ids[p] : -1;
    const bool valid = e >= 0 && e < num_experts;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    const int32_t row = valid ? next[e] + rank : -1;
    __syncwarp();
    if (valid && rank == 0) next[e] += __popc(same);
    __syncwarp();  // orders the counter update before the next round's reads
    if (p < end) {
      pair_row[p] = row;
      if (valid) row_token[row] = p / top_k;
    }
  }
}

// Few pairs: the whole sort in one launch (one block): shared-memory histogram,
// scan into group_start, then one warp assigns rows in pair order as
// align_scatter_kernel does for one chunk. Same result as the three launches.
__global__ void __launch_bounds__(kScanThreads) align_small_kernel(const int32_t* __restrict__ ids, int pairs,
                                                                   int top_k, int num_experts, int32_t* group_start,
                                                                   int32_t* group_rows, int32_t* expert_counts,
                                                                   int32_t* pair_row, int32_t* row_token) {
  extern __shared__ int32_t shared[];
  int32_t* count = shared;              // [E]
  int32_t* next = shared + num_experts;  // [E]
  __shared__ int32_t partial[kScanThreads];
  const int t = threadIdx.x;
  for (int e = t; e < num_experts; e += kScanThreads) count[e] = 0;
  __syncthreads();
  for (int p = t; p < pairs; p += kScanThreads) {
    const int e = ids[p];
    if (e >= 0 && e < num_experts) atomicAdd(&count[e], 1);  // integer: order-free
  }
  __syncthreads();
  const int per = (num_experts + kScanThreads - 1) / kScanThreads;
  const int begin = min(num_experts, t * per), end = min(num_experts, begin + per);
  int32_t sum = 0;
  for (int e = begin; e < end; ++e) sum += count[e];
  partial[t] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off *= 2) {
    const int32_t v = t >= off ? partial[t - off] : 0;
    __syncthreads();
    partial[t] += v;
    __syncthreads();
  }
  int32_t run = partial[t] - sum;
  for (int e = begin; e < end; ++e) {
    group_start[e] = run;
    group_rows[e] = count[e];
    if (expert_counts != nullptr) expert_counts[e] = count[e];
    next[e] = run;
    run += count[e];
  }
  __syncthreads();
  if (t >= kWarpSize) return;
  for (int base = 0; base < pairs; base += kWarpSize) {
    const int p = base + t;
    const int e = p < pairs ? ids[p] : -1;
    const bool valid = e >= 0 && e < num_experts;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
    const int rank = __popc(same & ((1u << t) - 1u));
    const int32_t row = valid ? next[e] + rank : -1;
    __syncwarp();
    if (valid && rank == 0) next[e] += __popc(same);
    __syncwarp();
    if (p < pairs) {
      pair_row[p] = row;
      if (valid) row_token[row] = p / top_k;
    }
  }
}

// Pairs and experts up to which align_small_kernel runs instead of the three launches.
constexpr int64_t kSmallMaxPairs = 1024;
constexpr int64_t kSmallMaxExperts = 4096;

}  // namespace

size_t align_workspace_size(int64_t max_pairs, int64_t num_experts) {
  return sizeof(int32_t) * static_cast<size_t>(num_chunks(max_pairs) * num_experts);
}

Status align_by_expert(const AlignProblem& pr, const AlignArgs& args, cudaStream_t stream) {
  const int64_t pairs = pr.num_pairs();
  const int64_t E = pr.num_experts;
  if (pairs > INT32_MAX / 2 || E < 1 || E > INT32_MAX / kMaxChunks) {
    return InvalidArgument("align: M*k or E out of range");
  }
  if (pairs <= kSmallMaxPairs && E <= kSmallMaxExperts) {
    const size_t smem = sizeof(int32_t) * 2 * static_cast<size_t>(E);
    align_small_kernel<<<1, kScanThreads, smem, stream>>>(args.topk_ids, static_cast<int>(pairs),
                                                          static_cast<int>(pr.top_k), static_cast<int>(E),
                                                          args.group_start, args.group_rows, args.expert_counts,
                                                          args.pair_row, args.row_token);
    MOEKIT_CUDA_CHECK_LAUNCH("align_small_kernel");
    return Status::Ok();
  }
  const int64_t chunks = num_chunks(pairs), chunk = chunk_size(pairs);
  auto* chunk_counts = static_cast<int32_t*>(args.workspace);  // [chunks, E]
  MOEKIT_CUDA_CHECK(cudaMemsetAsync(chunk_counts, 0, sizeof(int32_t) * chunks * E, stream));
  if (pairs > 0) {
    const int threads = 256;
    align_count_kernel<<<static_cast<unsigned>((pairs + threads - 1) / threads), threads, 0, stream>>>(
        args.topk_ids, static_cast<int>(pairs), static_cast<int>(chunk), static_cast<int>(E), chunk_counts);
    MOEKIT_CUDA_CHECK_LAUNCH("align_count_kernel");
  }
  align_scan_kernel<<<1, kScanThreads, 0, stream>>>(static_cast<int>(chunks), static_cast<int>(E), chunk_counts,
                                                    args.group_start, args.group_rows, args.expert_counts);
  MOEKIT_CUDA_CHECK_LAUNCH("align_scan_kernel");
  if (pairs > 0) {
    const int warps = 4;
    align_scatter_kernel<<<static_cast<unsigned>((chunks + warps - 1) / warps), warps * kWarpSize, 0, stream>>>(
        args.topk_ids, static_cast<int>(pairs), static_cast<int>(chunk), static_cast<int>(chunks),
        static_cast<int>(pr.top_k), static_cast<int>(E), chunk_counts, args.pair_row, args.row_token);
    MOEKIT_CUDA_CHECK_LAUNCH("align_scatter_kernel");
  }
  return Status::Ok();
}

}  // namespace moekit::cuda
