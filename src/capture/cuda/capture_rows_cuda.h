// The device side of a capture step's end (RoutedExpertsCapturer::end_step_async
// on a CUDA device): one kernel moves rows [0, M) of every layer from the
// capture buffer to mapped pinned host memory and puts the sentinel back.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::capture_cuda {

// Layer l's rows start at l * layer_stride elements in every buffer below.
struct CaptureRowsArgs {
  int num_layers = 0;
  int64_t layer_stride = 0;         // elements: max_num_tokens * top_k
  int64_t row_elements = 0;         // elements per layer to move: M * top_k
  int16_t* ids = nullptr;           // [L, max_tokens, k] i16, device; rows [0, M) reset to -1
  int16_t* host_ids = nullptr;      // [L, max_tokens, k] i16, pinned host, device-mapped pointer
  const float* weights = nullptr;   // [L, max_tokens, k] f32, device, optional (router weights)
  float* host_weights = nullptr;    // [L, max_tokens, k] f32, pinned host, device-mapped, iff weights
};

// One launch on `stream`, no host synchronization (graph capturable).
cudaError_t move_capture_rows_to_host(const CaptureRowsArgs& args, cudaStream_t stream);

}  // namespace moekit::capture_cuda

#endif  // MOEKIT_WITH_CUDA
