// The one error path for CUDA runtime calls (STYLE.md rule 2): a failed call
// becomes a moekit::Status naming the statement, file:line, device and the
// runtime's error string, built by one out-of-line function.
//
//   MOEKIT_CUDA_CHECK(cudaMemcpyAsync(...));    // returns the Status from the enclosing function
//   kernel<<<grid, block, 0, stream>>>(...);
//   MOEKIT_CUDA_CHECK_LAUNCH("align_count");    // the launch's own error (cudaGetLastError)
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include "moekit/status.h"

namespace moekit::cuda {

// "CUDA error in `stmt` at file:line on cuda:D: <name>: <string>". Clears the
// runtime's sticky last error for non-sticky failures so later calls start clean.
Status cuda_error_status(cudaError_t err, const char* stmt, const char* file, int line);

}  // namespace moekit::cuda

#define MOEKIT_CUDA_CHECK(stmt)                                                        \
  do {                                                                                 \
    const cudaError_t moekit_cuda_err_ = (stmt);                                       \
    if (moekit_cuda_err_ != cudaSuccess)                                               \
      return ::moekit::cuda::cuda_error_status(moekit_cuda_err_, #stmt, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports a bad launch configuration (or an earlier
// asynchronous error) naming the kernel.
#define MOEKIT_CUDA_CHECK_LAUNCH(kernel_name)                                          \
  do {                                                                                 \
    const cudaError_t moekit_cuda_err_ = cudaGetLastError();                           \
    if (moekit_cuda_err_ != cudaSuccess)                                               \
      return ::moekit::cuda::cuda_error_status(moekit_cuda_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

#endif  // MOEKIT_WITH_CUDA
