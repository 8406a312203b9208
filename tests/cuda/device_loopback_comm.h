// A test-only Communicator whose N ranks are threads sharing ONE CUDA device:
// the GPU expert-parallel path (ExpertParallelLayer over device buffers) runs
// on a single GPU, without NCCL. Each collective waits for the caller's
// stream, meets the other ranks on the host, and copies device to device on
// the caller's stream (whole max_rows blocks, as the NCCL communicator does).
// Eager only: its host waits cannot be captured in a CUDA graph.
#pragma once

#include <memory>

#include "moekit/comm.h"

namespace moekit::cuda_test {

class DeviceLoopbackGroup;

// One group of `size` ranks on cuda:`device`; make_rank(r) once per rank (any thread).
std::shared_ptr<DeviceLoopbackGroup> make_device_loopback_group(int size, int device);
std::unique_ptr<Communicator> make_device_loopback_rank(const std::shared_ptr<DeviceLoopbackGroup>& group, int rank);

}  // namespace moekit::cuda_test
