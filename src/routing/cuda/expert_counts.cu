// Counting kernels of the routing step: see expert_counts.h.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "routing/cuda/expert_counts.h"

namespace moekit::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One thread per (token, slot). Integer atomics: the counts do not depend on order.
__global__ void record_caller_ids_kernel(const int32_t* ids, int64_t pairs, int64_t num_experts, int32_t* counts,
                                         int16_t* ids_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int32_t e = ids[i];
  if (counts != nullptr && e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
  if (ids_out != nullptr) ids_out[i] = static_cast<int16_t>(e);
}

__global__ void accumulate_expert_load_kernel(const int32_t* counts, int64_t* load, int64_t num_experts) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < num_experts) load[e] += counts[e];
}

}  // namespace

Status record_caller_ids(const int32_t* ids, int64_t m, int64_t k, int64_t num_experts, int32_t* counts,
                         int16_t* ids_out, cudaStream_t stream) {
  if (counts != nullptr) MOEKIT_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * num_experts, stream));
  const int64_t pairs = m * k;
  if (pairs == 0 || (counts == nullptr && ids_out == nullptr)) return Status::Ok();
  record_caller_ids_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(ids, pairs, num_experts, counts, ids_out);
  MOEKIT_CUDA_CHECK_LAUNCH("record_caller_ids_kernel");
  return Status::Ok();
}

Status accumulate_expert_load(const int32_t* counts, int64_t* load, int64_t num_experts, cudaStream_t stream) {
  if (num_experts < 1) return Status::Ok();
  accumulate_expert_load_kernel<<<blocks_for(num_experts), kThreads, 0, stream>>>(counts, load, num_experts);
  MOEKIT_CUDA_CHECK_LAUNCH("accumulate_expert_load_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda
