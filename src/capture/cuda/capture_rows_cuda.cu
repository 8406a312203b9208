#include "capture/cuda/capture_rows_cuda.h"

#include <algorithm>

namespace moekit::capture_cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride beyond this; the copy is bound by the host link, not by SMs

// Consecutive threads take consecutive elements of a layer's rows, so the
// stores to host memory coalesce into full PCIe writes.
__global__ void move_capture_rows_kernel(CaptureRowsArgs a) {
  const int64_t total = static_cast<int64_t>(a.num_layers) * a.row_elements;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = (i / a.row_elements) * a.layer_stride + i % a.row_elements;
    a.host_ids[at] = a.ids[at];
    a.ids[at] = -1;  // kUnwrittenExpertId (moekit/capture.h): armed for the next step
    if (a.weights != nullptr) a.host_weights[at] = a.weights[at];
  }
}

}  // namespace

cudaError_t move_capture_rows_to_host(const CaptureRowsArgs& args, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(args.num_layers) * args.row_elements;
  if (total == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, (total + kThreads - 1) / kThreads));
  move_capture_rows_kernel<<<blocks, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace moekit::capture_cuda
