// The device side of record_caller_ids and accumulate_expert_load
// (moekit/routing.h), on validated pointers.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/status.h"

namespace moekit::cuda {

// counts [E] (optional) overwritten, ids_out [>= m, k] (optional) rows [0, m) written.
Status record_caller_ids(const int32_t* ids, int64_t m, int64_t k, int64_t num_experts, int32_t* counts,
                         int16_t* ids_out, cudaStream_t stream);
Status accumulate_expert_load(const int32_t* counts, int64_t* load, int64_t num_experts, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA
